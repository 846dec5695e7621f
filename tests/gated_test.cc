// The gated ensemble: its gradients against a hand-written computation of
// the formulas, a shared trunk's gradients adding up, the distributed
// lockstep against the one-graph run and plain libtorch, a missing worker
// named after the deadline, and the same job over gRPC processes.
#include "shoal/strategy/gated_strategy.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <thread>

#include "inproc_servers.h"
#include "quick_job.h"
#include "shoal/server/variable_service.h"
#include "shoal/session/local_cluster.h"
#include "shoal/session/task_runner.h"
#include "shoal/transport/inproc/inproc_transport.h"

namespace shoal {
namespace {

// MLP networks by their hidden sizes.
std::vector<GatedNetworkConfig> MlpNetworks(const std::vector<std::vector<int64_t>>& hidden) {
  std::vector<GatedNetworkConfig> networks;
  for (const auto& h : hidden) networks.push_back(GatedNetworkConfig{h, std::nullopt});
  return networks;
}

std::unique_ptr<GatedEnsemble> MakeEnsemble(const ModelConfig& base, const GatedModelConfig& config) {
  auto ensemble = GatedEnsemble::Create(base, config);
  EXPECT_TRUE(ensemble.ok()) << ensemble.status();
  return std::move(ensemble).value();
}

// Linear networks and a linear master: every gradient has a closed form.
GatedModelConfig LinearEnsemble(const std::string& output, const std::string& scale, const std::string& loss,
                                bool to_workers) {
  GatedModelConfig g;
  g.networks = MlpNetworks({{}, {}, {}});
  g.master_hidden = {};
  g.output = output;
  g.scale = scale;
  g.master_loss = loss;
  g.master_loss_to_workers = to_workers;
  return g;
}

// The formulas of model/gated_ensemble.h written out by hand, in float64:
// gradients of [W_0, b_0, ..., W_{K-1}, b_{K-1}, M, m].
std::vector<torch::Tensor> HandWrittenGradients(GatedEnsemble& ensemble, const torch::Tensor& x,
                                                const torch::Tensor& y) {
  const GatedModelConfig& g = ensemble.config();
  auto d = [](const torch::Tensor& t) { return t.detach().to(torch::kFloat64); };
  const int K = ensemble.num_networks();
  const int64_t B = x.size(0);
  const torch::Tensor X = d(x);
  std::vector<torch::Tensor> logits, probabilities;
  std::vector<torch::Tensor> correct;
  for (int k = 0; k < K; ++k) {
    const auto& p = ensemble.network(k).variables();
    logits.push_back(X.matmul(d(p[0])) + d(p[1]));
    probabilities.push_back(torch::softmax(logits.back(), 1));
    correct.push_back(logits.back().argmax(1).eq(y).to(torch::kFloat64));
  }
  const int64_t C = logits[0].size(1);
  const torch::Tensor Y = torch::one_hot(y, C).to(torch::kFloat64);
  const torch::Tensor input = torch::cat(logits, 1);
  const torch::Tensor M = d(ensemble.master().variables()[0]), m = d(ensemble.master().variables()[1]);
  const torch::Tensor Z = input.matmul(M) + m;
  const torch::Tensor W = g.output == "softmax" ? torch::softmax(Z, 1) : torch::sigmoid(Z);
  const torch::Tensor right = torch::stack(correct, 1);
  torch::Tensor dZ;
  if (g.master_loss == "mse") {
    const torch::Tensor dW = 2 * (W - right) / static_cast<double>(B * K);
    dZ = g.output == "softmax" ? W * (dW - (dW * W).sum(1, true)) : dW * W * (1 - W);
  } else {
    const torch::Tensor count = right.sum(1, true);
    const torch::Tensor target = torch::where(count > 0, right / count.clamp_min(1), torch::full_like(W, 1.0 / K));
    dZ = (W - target) / static_cast<double>(B);
  }
  const torch::Tensor S = g.scale == "per_sample" ? W : W.mean(0, true).expand_as(W);
  const torch::Tensor d_input = dZ.matmul(M.t());
  std::vector<torch::Tensor> gradients;
  for (int k = 0; k < K; ++k) {
    torch::Tensor G = S.narrow(1, k, 1) * (probabilities[k] - Y) / static_cast<double>(B);
    if (g.master_loss_to_workers) G = G + d_input.narrow(1, k * C, C);
    gradients.push_back(X.t().matmul(G));
    gradients.push_back(G.sum(0));
  }
  gradients.push_back(input.t().matmul(dZ));
  gradients.push_back(dZ.sum(0));
  return gradients;
}

TEST(GatedEnsembleTest, GradientsMatchTheHandWrittenFormulas) {
  ModelConfig base;
  base.layers = {6, 4};
  base.seed = 3;
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({16, 6});
  const torch::Tensor y = torch::randint(0, 4, {16}, torch::kInt64);
  for (const GatedModelConfig& g :
       {LinearEnsemble("softmax", "batch_mean", "mse", false), LinearEnsemble("softmax", "per_sample", "mse", false),
        LinearEnsemble("sigmoid", "per_sample", "mse", false),
        LinearEnsemble("softmax", "per_sample", "cross_entropy", false),
        LinearEnsemble("softmax", "batch_mean", "mse", true), LinearEnsemble("sigmoid", "per_sample", "mse", true)}) {
    const std::string what = g.output + " " + g.scale + " " + g.master_loss + (g.master_loss_to_workers ? " +flow" : "");
    auto built = MakeEnsemble(base, g);
    GatedEnsemble& ensemble = *built;
    const GatedStepResult step = ensemble.OneGraphStep(x, y);
    const std::vector<torch::Tensor> expected = HandWrittenGradients(ensemble, x, y);
    ASSERT_EQ(step.gradients.size(), expected.size()) << what;
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(step.gradients[i].to(torch::kFloat64).allclose(expected[i], 1e-5, 1e-7))
          << what << ": " << ensemble.variable_names()[i] << "\n"
          << step.gradients[i] << "\nexpected\n"
          << expected[i];
    }
    EXPECT_GT(step.gradients.back().abs().sum().item<double>(), 0) << what << ": the master must learn";
  }
}

TEST(GatedEnsembleTest, CrossEntropyAsksForEqualWeightsWhereNoNetworkIsRight) {
  const torch::Tensor weights = torch::tensor({{0.7f, 0.2f, 0.1f}});
  const torch::Tensor none_right = torch::zeros({1, 3});
  EXPECT_NEAR(MasterLoss(weights, none_right, "cross_entropy").item<double>(),
              -(std::log(0.7) + std::log(0.2) + std::log(0.1)) / 3, 1e-6);
  const torch::Tensor two_right = torch::tensor({{1.f, 0.f, 1.f}});
  EXPECT_NEAR(MasterLoss(weights, two_right, "cross_entropy").item<double>(),
              -(std::log(0.7) + std::log(0.1)) / 2, 1e-6);
}

TEST(GatedEnsembleTest, TrunkGradientsOfTheNetworksAddUp) {
  ModelConfig base;
  base.layers = {6, 4};
  GatedModelConfig g;
  g.networks = MlpNetworks({{5}, {3}});
  g.trunk = {7};
  g.scale = "per_sample";
  auto built = MakeEnsemble(base, g);
  GatedEnsemble& ensemble = *built;
  torch::manual_seed(2);
  const torch::Tensor x = torch::randn({12, 6});
  const torch::Tensor y = torch::randint(0, 4, {12}, torch::kInt64);
  const GatedStepResult step = ensemble.OneGraphStep(x, y);
  // Each network's scaled loss on its own, with the weights of the step.
  Mlp* trunk = ensemble.trunk();
  ASSERT_NE(trunk, nullptr);
  const torch::Tensor scales = NetworkScales(step.weights, g.scale);
  std::vector<torch::Tensor> summed;
  for (int k = 0; k < 2; ++k) {
    for (const auto& p : trunk->variables()) p.mutable_grad().reset();
    ScaledNetworkLoss(ensemble.NetworkLogits(k, x), y, scales.select(1, k)).backward();
    const auto grads = trunk->Gradients();
    for (size_t i = 0; i < grads.size(); ++i) {
      if (k == 0) summed.push_back(grads[i].clone());
      else summed[i] += grads[i];
    }
  }
  for (size_t i = 0; i < summed.size(); ++i) {
    EXPECT_TRUE(step.gradients[i].allclose(summed[i], 1e-5, 1e-7)) << trunk->variable_names()[i];
    EXPECT_GT(summed[i].abs().sum().item<double>(), 0);
  }
}

TEST(GatedEnsembleTest, WeightedVotePicksTheClassWithTheMostWeight) {
  // Networks 0 and 1 say class 2, network 2 says class 0 with more weight
  // than both together on the first example, less on the second.
  const torch::Tensor two = torch::tensor({{0.f, 0.f, 1.f}, {0.f, 0.f, 1.f}});
  const torch::Tensor zero = torch::tensor({{1.f, 0.f, 0.f}, {1.f, 0.f, 0.f}});
  const torch::Tensor weights = torch::tensor({{0.2f, 0.2f, 0.6f}, {0.3f, 0.3f, 0.4f}});
  const torch::Tensor votes = WeightedVote({two, two, zero}, weights);
  EXPECT_EQ(votes[0].item<int64_t>(), 0);
  EXPECT_EQ(votes[1].item<int64_t>(), 2);
}

TEST(GatedEnsembleTest, EvaluateCountsWhatEachPredictorGetsRight) {
  ModelConfig base;
  base.layers = {6, 4};
  GatedModelConfig g;
  g.networks = MlpNetworks({{5}, {3}, {}});
  auto built = MakeEnsemble(base, g);
  GatedEnsemble& ensemble = *built;
  torch::manual_seed(4);
  const Dataset data{torch::randn({50, 6}), torch::randint(0, 4, {50}, torch::kInt64)};
  const GatedAccuracy accuracy = ensemble.Evaluate(data, /*batch_size=*/16);  // batches of 16, 16, 16, 2
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> logits;
  for (int k = 0; k < 3; ++k) logits.push_back(ensemble.NetworkLogits(k, data.images));
  const torch::Tensor weights = ensemble.MasterWeights(logits, data.images);
  const torch::Tensor right = Correctness(logits, data.labels);
  for (int k = 0; k < 3; ++k) {
    EXPECT_NEAR(accuracy.networks[k], right.select(1, k).mean().item<double>(), 1e-6) << k;
    EXPECT_NEAR(accuracy.mean_weights[k], weights.select(1, k).mean().item<double>(), 1e-6) << k;
  }
  EXPECT_NEAR(accuracy.any_right, right.amax(1).mean().item<double>(), 1e-6);
  EXPECT_NEAR(accuracy.gated_vote,
              WeightedVote(logits, weights).eq(data.labels).to(torch::kFloat64).mean().item<double>(), 1e-6);
  torch::Tensor mean_probabilities = torch::zeros({50, 4});
  for (const auto& l : logits) mean_probabilities += torch::softmax(l, 1) / 3;
  EXPECT_NEAR(accuracy.uniform_average,
              mean_probabilities.argmax(1).eq(data.labels).to(torch::kFloat64).mean().item<double>(), 1e-6);
}

// A small gated job on Fashion-MNIST: 600 examples in batches of 32 (so that
// step 19 meets the smaller last batch of the epoch), 20 steps.
JobConfig SmallGatedJob(bool trunk_and_flow) {
  JobConfig config = QuickJob("gated");
  config.cluster.ps = 2;
  config.data.train_examples = 600;
  config.data.test_examples = 500;
  config.training.batch_size = 32;
  config.training.max_steps = 20;
  config.training.optimizer = wire::OptimizerConfig();
  config.training.optimizer.set_kind("adam");
  config.training.optimizer.set_learning_rate(0.01);
  config.gated.networks = MlpNetworks({{32}, {16}, {8}});
  config.gated.master_hidden = {8};
  if (trunk_and_flow) {
    config.gated.trunk = {24};
    config.gated.master_loss_to_workers = true;
    config.gated.scale = "per_sample";
    config.gated.master_sees_input = true;
  } else {
    config.gated.master_loss = "cross_entropy";
  }
  return config;
}

struct GatedRun {
  std::vector<absl::StatusOr<WorkerResult>> results;
  std::vector<torch::Tensor> values;  // the ensemble's variables afterwards
};

// Runs `config` with `workers` worker tasks in this process (those in
// `absent` never start) and reads the ensemble's variables at the end.
GatedRun RunGated(JobConfig config, int workers, const std::set<int>& absent = {}) {
  config.cluster.workers = workers;
  const ClusterSpec cluster = ClusterSpec::Local(config.cluster.ps, workers);
  auto data = LoadData(config).value();
  std::set<TaskId> absent_tasks;
  for (int w : absent) absent_tasks.insert(TaskId{"worker", w});
  InProcServers servers(config, cluster, absent_tasks);
  InProcTransport& transport = servers.transport;
  auto placement = MakePlacement(config, cluster).value();
  GatedRun run;
  run.results.assign(workers, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    if (absent.count(w)) continue;
    threads.emplace_back([&, w] {
      auto client = Client::Create(cluster, &transport, placement).value();
      WorkerContext context = MakeWorkerContext(config, cluster, TaskId{"worker", w}, client.get(), data.train,
                                                config.training.max_steps);
      run.results[w] = GatedStrategy().RunWorker(context);
    });
  }
  for (auto& t : threads) t.join();
  auto client = Client::Create(cluster, &transport, placement).value();
  const auto ensemble = MakeEnsemble(config.model, ResolveGatedConfig(config.gated, config.model, workers).value());
  auto values = client->Read(ensemble->variable_names());
  if (values.ok()) {
    for (const auto& v : *values) run.values.push_back(v.clone());
  }
  return run;
}

// The same steps in plain libtorch: one graph, torch::optim::Adam.
std::vector<torch::Tensor> TrainWithLibtorch(const JobConfig& config) {
  auto data = LoadData(config).value();
  auto built = MakeEnsemble(config.model, ResolveGatedConfig(config.gated, config.model, 1).value());
  GatedEnsemble& ensemble = *built;
  torch::optim::Adam adam(ensemble.variables(), torch::optim::AdamOptions(config.training.optimizer.learning_rate()));
  BatchIterator batches = GatedBatchIndices(data.train, config);
  for (int64_t t = 0; t < config.training.max_steps; ++t) {
    torch::Tensor rows, labels;
    batches.Next(&rows, &labels);
    adam.zero_grad();
    ensemble.OneGraphStep(data.train.images.index_select(0, rows.squeeze(1).to(torch::kInt64)), labels);
    adam.step();
  }
  std::vector<torch::Tensor> values;
  for (const auto& v : ensemble.variables()) values.push_back(v.detach().clone());
  return values;
}

void ExpectSameParameters(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                          const std::vector<std::string>& names, const std::string& what) {
  ASSERT_EQ(a.size(), names.size()) << what;
  ASSERT_EQ(b.size(), names.size()) << what;
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_TRUE(a[i].allclose(b[i], 1e-5, 1e-5))
        << what << ": " << names[i] << " differs by " << (a[i] - b[i]).abs().max().item<double>();
  }
}

TEST(GatedTrainingTest, DistributedLockstepReachesTheOneGraphParameters) {
  for (bool trunk_and_flow : {false, true}) {
    const JobConfig config = SmallGatedJob(trunk_and_flow);
    const std::string what = trunk_and_flow ? "trunk, per-sample, master loss to workers" : "cross-entropy master";
    GatedRun distributed = RunGated(config, 3);
    for (int w = 0; w < 3; ++w) ASSERT_TRUE(distributed.results[w].ok()) << what << " worker " << w << ": "
                                                                         << distributed.results[w].status();
    GatedRun one_task = RunGated(config, 1);
    ASSERT_TRUE(one_task.results[0].ok()) << one_task.results[0].status();
    const std::vector<torch::Tensor> libtorch = TrainWithLibtorch(config);
    const auto ensemble = MakeEnsemble(config.model, ResolveGatedConfig(config.gated, config.model, 3).value());
    ExpectSameParameters(distributed.values, one_task.values, ensemble->variable_names(), what + ", 3 tasks vs 1");
    ExpectSameParameters(one_task.values, libtorch, ensemble->variable_names(), what + ", 1 task vs libtorch");
    // And they trained: the parameters moved from their initial values.
    EXPECT_FALSE(distributed.values.back().allclose(ensemble->variables().back().detach())) << what;
  }
}

TEST(GatedTrainingTest, AMissingWorkerIsNamedAfterTheDeadline) {
  JobConfig config = SmallGatedJob(false);
  config.training.sync_timeout_s = 1;
  GatedRun run = RunGated(config, 3, /*absent=*/{2});
  ASSERT_FALSE(run.results[0].ok());
  EXPECT_EQ(run.results[0].status().code(), absl::StatusCode::kDeadlineExceeded) << run.results[0].status();
  EXPECT_NE(run.results[0].status().message().find("/job:worker/task:2"), std::string::npos)
      << run.results[0].status();
  EXPECT_FALSE(run.results[1].ok());  // released, not left waiting
}

TEST(GatedTrainingTest, ProcessesOverGrpcTrainExactlyAsThreadsDo) {
  JobConfig config = SmallGatedJob(true);
  config.training.max_steps = 0;
  config.training.epochs = 1;
  config.data.train_examples = 2000;
  config.cluster.workers = 3;
  auto in_process = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(in_process.ok()) << in_process.status();
  auto processes = TrainInLocalProcesses(config, SHOAL_BINARY, /*show_progress=*/false);
  ASSERT_TRUE(processes.ok()) << processes.status();
  ASSERT_EQ(processes->network_test_accuracies.size(), 3u);
  EXPECT_EQ(processes->global_step, 2000 / 32 + 1);
  EXPECT_DOUBLE_EQ(processes->test_accuracy, in_process->test_accuracy);
  EXPECT_DOUBLE_EQ(processes->uniform_average_accuracy, in_process->uniform_average_accuracy);
  for (int k = 0; k < 3; ++k) {
    EXPECT_DOUBLE_EQ(processes->network_test_accuracies[k], in_process->network_test_accuracies[k]) << k;
    EXPECT_GT(processes->network_test_accuracies[k], 0.5) << k;
  }
}

}  // namespace
}  // namespace shoal
