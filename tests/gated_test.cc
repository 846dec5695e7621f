// The gated ensemble: its gradients against a hand-written computation of
// the formulas, a shared trunk's gradients adding up, the distributed
// lockstep against the one-graph run and plain libtorch, a missing worker
// named after the deadline, and the same job over gRPC processes.
#include "shoal/strategy/gated_strategy.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "inproc_servers.h"
#include "quick_job.h"
#include "saved_values.h"
#include "scripted_modules.h"
#include "step_recorder.h"
#include "temp_dir.h"
#include "shoal/server/variable_service.h"
#include "shoal/session/local_cluster.h"
#include "shoal/session/task_runner.h"
#include "shoal/transport/inproc/inproc_transport.h"
#include "source_paths.h"

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

// A small CNN with BatchNorm and no dropout (so that every form of a job
// computes the same thing).
ModelConfig SmallCnnModel() {
  ModelConfig cnn;
  cnn.kind = "cnn";
  cnn.cnn.conv = {{4}, {8}};
  cnn.cnn.dense = {16};
  cnn.cnn.dropout = 0;
  return cnn;
}

ModelConfig TorchScriptModel(const fs::path& path) {
  ModelConfig model;
  model.kind = "torchscript";
  model.path = path.string();
  return model;
}

// An MLP, a CNN with BatchNorm and a TorchScript module with BatchNorm as the
// networks, and a TorchScript master: three ways to spell a network.
GatedModelConfig MixedEnsemble(const fs::path& dir) {
  SaveScriptedBatchNormMlp(dir / "net_2.pt");
  SaveScriptedLinear(dir / "master.pt", 3 * 10, 3);
  GatedModelConfig g;
  g.networks = MlpNetworks({{16}});
  g.networks.push_back(GatedNetworkConfig{{}, SmallCnnModel()});
  g.networks.push_back(GatedNetworkConfig{{}, TorchScriptModel(dir / "net_2.pt")});
  g.master = TorchScriptModel(dir / "master.pt");
  return g;
}

TEST(GatedEnsembleTest, AnyModelCanBeANetworkOrTheMaster) {
  const fs::path dir = FreshTempDir("shoal_gated_", "mixed");
  const ModelConfig base;  // 784 inputs, 10 classes
  auto resolved = ResolveGatedConfig(MixedEnsemble(dir), base, 3);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  auto built = MakeEnsemble(base, *resolved);
  GatedEnsemble& ensemble = *built;
  const std::vector<std::string>& names = ensemble.variable_names();
  for (const char* name : {"net_0/dense_1/kernel", "net_1/conv_1/kernel", "net_1/bn_1/gamma", "net_2/fc1.weight",
                           "net_2/bn1.weight", "master/fc.weight", "master/fc.bias"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  EXPECT_EQ(ensemble.buffer_names(),
            (std::vector<std::string>{"net_1/bn_1/moving_mean", "net_1/bn_1/moving_variance",
                                      "net_1/bn_1/num_batches_tracked", "net_1/bn_2/moving_mean",
                                      "net_1/bn_2/moving_variance", "net_1/bn_2/num_batches_tracked",
                                      "net_2/bn1.running_mean", "net_2/bn1.running_var",
                                      "net_2/bn1.num_batches_tracked"}));
  torch::manual_seed(3);
  const Dataset data{torch::randn({8, 1, 28, 28}), torch::randint(0, 10, {8}, torch::kInt64)};
  ASSERT_TRUE(ensemble.CheckShapes(data).ok()) << ensemble.CheckShapes(data);
  const std::vector<torch::Tensor> before = ensemble.BufferValues();
  EXPECT_EQ(before[2].item<int64_t>(), 0) << "the shape check runs in evaluation mode";
  const GatedStepResult step = ensemble.OneGraphStep(data.images, data.labels);
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_GT(step.gradients[i].abs().sum().item<double>(), 0) << names[i] << " got no gradient";
  }
  const std::vector<torch::Tensor> after = ensemble.BufferValues();
  EXPECT_EQ(after[2].item<int64_t>(), 1);  // one training forward pass each
  EXPECT_EQ(after[8].item<int64_t>(), 1);
  EXPECT_FALSE(after[0].equal(before[0]));
  EXPECT_FALSE(after[6].equal(before[6]));
  // Evaluation uses the statistics and moves none of them.
  ensemble.Evaluate(data);
  EXPECT_TRUE(ensemble.BufferValues()[2].equal(after[2]));
  fs::remove_all(dir);
}

TEST(GatedEnsembleTest, APartThatDoesNotFitIsNamedBeforeTraining) {
  const fs::path dir = FreshTempDir("shoal_gated_", "misfit");
  const ModelConfig base;
  torch::manual_seed(3);
  const Dataset data{torch::randn({4, 1, 28, 28}), torch::randint(0, 10, {4}, torch::kInt64)};
  struct Misfit {
    std::string what;
    std::function<void(GatedModelConfig&)> spoil;
    std::string expected;
  };
  const std::vector<Misfit> misfits = {
      {"a network with 5 classes",
       [&](GatedModelConfig& g) {
         ModelConfig five = SmallCnnModel();
         five.cnn.classes = 5;
         g.networks[1].model = five;
       },
       "gated.networks[1]: forward() maps a batch of shape [2, 1, 28, 28] to [2, 5]; expected [2, 10] logits"},
      {"a master with 2 weights for 3 networks",
       [&](GatedModelConfig& g) {
         SaveScriptedLinear(dir / "two.pt", 30, 2);
         g.master = TorchScriptModel(dir / "two.pt");
       },
       "gated.master: forward() maps the networks' logits [2, 30] to [2, 2]; expected one weight per network, [2, 3]"},
      {"a master that reads the wrong width",
       [&](GatedModelConfig& g) {
         SaveScriptedLinear(dir / "narrow.pt", 20, 3);
         g.master = TorchScriptModel(dir / "narrow.pt");
       },
       "gated.master: forward() fails on a batch of shape [2, 30]"},
  };
  for (const Misfit& misfit : misfits) {
    GatedModelConfig g = MixedEnsemble(dir);
    misfit.spoil(g);
    auto resolved = ResolveGatedConfig(g, base, 3);
    ASSERT_TRUE(resolved.ok()) << misfit.what << ": " << resolved.status();
    auto ensemble = MakeEnsemble(base, *resolved);
    const absl::Status status = ensemble->CheckShapes(data);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << misfit.what << ": " << status;
    EXPECT_NE(status.message().find(misfit.expected), std::string::npos) << misfit.what << ": " << status;
  }
  // Refused by the config: a trunk in front of a CNN, a regression loss, a
  // file that is not there.
  GatedModelConfig trunk = MixedEnsemble(dir);
  trunk.trunk = {32};
  EXPECT_NE(ResolveGatedConfig(trunk, base, 3).status().message().find("'gated.trunk' feeds MLP networks"),
            std::string::npos);
  GatedModelConfig mse = MixedEnsemble(dir);
  mse.networks[1].model->loss = "mse";
  EXPECT_NE(ResolveGatedConfig(mse, base, 3).status().message().find("gated.networks[1]"), std::string::npos);
  GatedModelConfig missing = MixedEnsemble(dir);
  missing.networks[2].model->path = (dir / "nowhere.pt").string();
  auto resolved = ResolveGatedConfig(missing, base, 3);
  ASSERT_TRUE(resolved.ok());
  auto ensemble = GatedEnsemble::Create(base, *resolved);
  EXPECT_TRUE(absl::IsNotFound(ensemble.status())) << ensemble.status();
  fs::remove_all(dir);
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
  std::vector<torch::Tensor> values;  // the ensemble's variables, then its buffers, afterwards
};

std::vector<std::string> StateNames(const GatedEnsemble& ensemble) {
  std::vector<std::string> names = ensemble.variable_names();
  names.insert(names.end(), ensemble.buffer_names().begin(), ensemble.buffer_names().end());
  return names;
}

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
  auto values = client->Read(StateNames(*ensemble));
  if (values.ok()) {
    for (const auto& v : *values) run.values.push_back(v.clone());
  }
  return run;
}

// The same steps in plain libtorch: one graph, torch::optim::Adam (or SGD).
std::vector<torch::Tensor> TrainWithLibtorch(const JobConfig& config) {
  auto data = LoadData(config).value();
  auto built = MakeEnsemble(config.model, ResolveGatedConfig(config.gated, config.model, 1).value());
  GatedEnsemble& ensemble = *built;
  const double lr = config.training.optimizer.learning_rate();
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (config.training.optimizer.kind() == "sgd") {
    optimizer = std::make_unique<torch::optim::SGD>(ensemble.variables(), torch::optim::SGDOptions(lr));
  } else {
    optimizer = std::make_unique<torch::optim::Adam>(ensemble.variables(), torch::optim::AdamOptions(lr));
  }
  torch::optim::Optimizer& adam = *optimizer;
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
  for (const auto& b : ensemble.BufferValues()) values.push_back(b);
  return values;
}

void ExpectSameParameters(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                          const std::vector<std::string>& names, const std::string& what) {
  ASSERT_EQ(a.size(), names.size()) << what;
  ASSERT_EQ(b.size(), names.size()) << what;
  for (size_t i = 0; i < names.size(); ++i) {
    const torch::Tensor x = a[i].to(torch::kFloat64), y = b[i].to(torch::kFloat64);  // buffers may be int64
    EXPECT_TRUE(x.allclose(y, 1e-5, 1e-5)) << what << ": " << names[i] << " differs by "
                                           << (x - y).abs().max().item<double>();
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
    ExpectSameParameters(distributed.values, one_task.values, StateNames(*ensemble), what + ", 3 tasks vs 1");
    ExpectSameParameters(one_task.values, libtorch, StateNames(*ensemble), what + ", 1 task vs libtorch");
    // And they trained: the parameters moved from their initial values.
    EXPECT_FALSE(distributed.values.back().allclose(ensemble->variables().back().detach())) << what;
  }
}

// What the hooks' BeforeUpdate sees of the master network's updates.
class MasterUpdateRecorder : public TrainingHook {
 public:
  absl::Status BeforeUpdate(const std::vector<std::string>& names, const std::vector<torch::Tensor>& /*update*/,
                            const StepInfo& step, StopRequest* /*stop*/) override {
    absl::MutexLock lock(&mu);
    if (!names.empty() && absl::StartsWith(names[0], "master/")) steps.push_back(step);
    return absl::OkStatus();
  }
  absl::Mutex mu;
  std::vector<StepInfo> steps ABSL_GUARDED_BY(mu);
};

TEST(GatedTrainingTest, HooksSeeTheMastersUpdateWithItsBatchAndNoAuc) {
  JobConfig config = SmallGatedJob(false);
  config.cluster.workers = 3;  // one per network
  auto recorder = std::make_shared<MasterUpdateRecorder>();
  auto report = TrainInProcess(config, InProcOptions{}, nullptr,
                               [&](WorkerContext& context) { context.extra_hooks.push_back(recorder); });
  ASSERT_TRUE(report.ok()) << report.status();
  absl::MutexLock lock(&recorder->mu);
  ASSERT_FALSE(recorder->steps.empty());
  for (const StepInfo& step : recorder->steps) {
    EXPECT_GT(step.examples, 0) << "step " << step.global_step;  // the batch's rows (fewer in the last)
    EXPECT_LE(step.examples, config.training.batch_size) << "step " << step.global_step;
    EXPECT_EQ(step.auc, -1) << "step " << step.global_step;  // a click model's batch AUC only
    EXPECT_GT(step.loss, 0) << "step " << step.global_step;
  }
}

// A gated job started again over a checkpoint reads its data on from where
// the checkpoint's step left it: the chief draws a batch a lockstep step.
// The set of 100 examples in batches of 30 ends each epoch with a batch of
// 10, which shows where in its epoch a step is. Over 3 tasks (one per
// network) and on one task (the whole ensemble).
TEST(GatedTrainingTest, AJobStartedAgainReadsOnFromItsCheckpointsStep) {
  for (int workers : {3, 1}) {
    const fs::path dir = FreshTempDir("shoal_gated_", "resume");
    JobConfig config = SmallGatedJob(false);
    config.cluster.workers = workers;
    config.data.train_examples = 100;
    config.training.batch_size = 30;
    config.training.max_steps = 5;  // 30, 30, 30, 10 | 30
    config.checkpoint.dir = dir.string();
    auto run = [&](std::vector<int64_t>* sizes) {
      auto recorder = std::make_shared<StepRecorder>();
      auto report = TrainInProcess(config, InProcOptions{}, nullptr, [&](WorkerContext& context) {
        if (context.is_chief) context.extra_hooks.push_back(recorder);
      });
      *sizes = recorder->BatchSizes();
      return report;
    };
    std::vector<int64_t> sizes;
    auto first = run(&sizes);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ(sizes, (std::vector<int64_t>{30, 30, 30, 10, 30})) << workers << " workers";
    config.training.max_steps = 10;
    auto second = run(&sizes);
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(second->restored_from, first->last_checkpoint);
    EXPECT_EQ(sizes, (std::vector<int64_t>{30, 30, 10, 30, 30})) << workers << " workers";
    // Other data (80 examples: 30, 30, 20) starts afresh, not at step 10's
    // place in it (which would draw 30, 20 first).
    config.data.train_examples = 80;
    config.training.max_steps = 13;
    auto third = run(&sizes);
    ASSERT_TRUE(third.ok()) << third.status();
    EXPECT_EQ(third->restored_from, second->last_checkpoint);
    EXPECT_EQ(sizes, (std::vector<int64_t>{30, 30, 20})) << workers << " workers";
    // On the same data again: its second epoch, counted from step 10 where
    // it began (not step 13's place counted from 0, which draws 30, 20, 30).
    config.training.max_steps = 16;
    auto fourth = run(&sizes);
    ASSERT_TRUE(fourth.ok()) << fourth.status();
    EXPECT_EQ(fourth->restored_from, third->last_checkpoint);
    EXPECT_EQ(sizes, (std::vector<int64_t>{30, 30, 20})) << workers << " workers";
    fs::remove_all(dir);
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

TEST(GatedTrainingTest, CnnAndTorchScriptPartsTrainInLockstepAsInOneGraph) {
  const fs::path dir = FreshTempDir("shoal_gated_", "lockstep");
  JobConfig config = SmallGatedJob(false);
  config.gated = MixedEnsemble(dir);
  config.gated.master_loss = "cross_entropy";
  config.training.buffer_publish_steps = 7;  // and at the last step
  // SGD: a bias in front of BatchNorm gets a gradient of rounding noise
  // only, which Adam would blow up to full steps of either sign.
  config.training.optimizer.set_kind("sgd");
  config.training.optimizer.set_learning_rate(0.05);
  GatedRun distributed = RunGated(config, 3);
  for (int w = 0; w < 3; ++w) {
    ASSERT_TRUE(distributed.results[w].ok()) << "worker " << w << ": " << distributed.results[w].status();
  }
  GatedRun one_task = RunGated(config, 1);
  ASSERT_TRUE(one_task.results[0].ok()) << one_task.results[0].status();
  const std::vector<torch::Tensor> libtorch = TrainWithLibtorch(config);
  const auto ensemble = MakeEnsemble(config.model, ResolveGatedConfig(config.gated, config.model, 3).value());
  ExpectSameParameters(distributed.values, one_task.values, StateNames(*ensemble), "3 tasks vs 1");
  ExpectSameParameters(one_task.values, libtorch, StateNames(*ensemble), "1 task vs libtorch");
  // Each network's task published its statistics of all 20 steps.
  const size_t variables = ensemble->variable_names().size();
  ASSERT_EQ(distributed.values.size(), variables + 9);
  EXPECT_EQ(distributed.values[variables + 2].item<int64_t>(), 20);  // net_1/bn_1/num_batches_tracked
  EXPECT_EQ(distributed.values[variables + 8].item<int64_t>(), 20);  // net_2/bn1.num_batches_tracked
  fs::remove_all(dir);
}

// CNN networks (copies of model:, seeded apart) and a TorchScript master as
// processes over gRPC: the ensemble learns, and each network's statistics
// count every step, as the task that trains it published them.
TEST(GatedTrainingTest, ProcessesTrainCnnNetworksUnderATorchScriptMaster) {
  const fs::path dir = FreshTempDir("shoal_gated_", "processes");
  SaveScriptedLinear(dir / "master.pt", 2 * 10, 2);
  JobConfig config = QuickJob("gated");
  config.model = SmallCnnModel();
  config.gated.master = TorchScriptModel(dir / "master.pt");
  config.data.train_examples = 4000;
  config.data.test_examples = 1000;
  config.training.epochs = 1;
  config.training.batch_size = 32;
  config.training.buffer_publish_steps = 10;
  config.checkpoint.dir = (dir / "ckpt").string();
  ASSERT_TRUE(ValidateJobConfig(config).ok()) << ValidateJobConfig(config);
  auto report = TrainInLocalProcesses(config, SHOAL_BINARY, /*show_progress=*/false);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->global_step, 4000 / 32);
  ASSERT_EQ(report->network_test_accuracies.size(), 2u);
  EXPECT_GT(report->test_accuracy, 0.6);  // chance is 0.1
  for (double accuracy : report->network_test_accuracies) EXPECT_GT(accuracy, 0.5);
  const auto saved = SavedValues(report->last_checkpoint);
  for (const char* counted : {"net_0/bn_2/num_batches_tracked", "net_1/bn_2/num_batches_tracked"}) {
    ASSERT_TRUE(saved.count(counted)) << counted;
    EXPECT_EQ(saved.at(counted).item<int64_t>(), report->global_step) << counted;
  }
  EXPECT_FALSE(saved.at("net_0/bn_1/moving_mean").equal(saved.at("net_1/bn_1/moving_mean")))
      << "the networks start apart";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shoal
