// DistBelief-style local replicas: each strategy against its update formulas,
// replayed by hand on the same batches (1e-6), model averaging exactly as
// TensorFlow's ModelAverageOptimizer test asserts it, and end-to-end runs.
#include "shoal/strategy/local_replica.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "process_helpers.h"
#include "quick_job.h"
#include "shoal/core/status.h"
#include "shoal/session/local_cluster.h"
#include "step_recorder.h"

namespace shoal {
namespace {

using Values = std::vector<torch::Tensor>;

Values Clone(const Values& values) {
  Values copies;
  for (const auto& v : values) copies.push_back(v.detach().clone());
  return copies;
}

// Records what a worker sends at each exchange with the ps, and its local and
// the global values right after.
class ExchangeRecorder : public TrainingHook {
 public:
  explicit ExchangeRecorder(Client* client) : client_(client) {}
  absl::Status BeforeUpdate(const std::vector<std::string>&, const Values& update, const StepInfo&,
                            StopRequest*) override {
    sent.push_back(Clone(update));
    return absl::OkStatus();
  }
  absl::Status AfterStep(const StepInfo& step, StopRequest*) override {
    if (!step.exchanged) return absl::OkStatus();
    local.push_back(Clone(step.model->variables()));
    SHOAL_ASSIGN_OR_RETURN(Values global_values, client_->Read(step.model->variable_names()));
    global.push_back(Clone(global_values));
    return absl::OkStatus();
  }
  std::vector<Values> sent, local, global;

 private:
  Client* client_;
};

wire::OptimizerConfig Sgd(double learning_rate) {
  wire::OptimizerConfig sgd;
  sgd.set_kind("sgd");
  sgd.set_learning_rate(learning_rate);
  return sgd;
}

// A tiny deterministic job: softmax regression on 256 Fashion-MNIST images.
JobConfig TinyJob(const std::string& mode, int workers, int64_t max_steps) {
  JobConfig config = QuickJob(mode);
  config.cluster.ps = 1;
  config.cluster.workers = workers;
  config.model.layers = {784, 10};
  config.data.train_examples = 256;
  config.data.test_examples = 100;
  config.training.batch_size = 32;
  config.training.max_steps = max_steps;
  config.local.optimizer = Sgd(0.05);
  return config;
}

// Runs `config` in-process with a recorder on every worker.
std::vector<std::shared_ptr<ExchangeRecorder>> RunRecorded(const JobConfig& config) {
  std::vector<std::shared_ptr<ExchangeRecorder>> recorders(config.cluster.workers);
  auto report = TrainInProcess(config, InProcOptions{}, nullptr, [&](WorkerContext& context) {
    recorders[context.worker_index] = std::make_shared<ExchangeRecorder>(context.client);
    context.extra_hooks.push_back(recorders[context.worker_index]);
  });
  EXPECT_TRUE(report.ok()) << report.status();
  return recorders;
}

// Worker 0's batches of a one-worker job, and gradients on them.
class Replay {
 public:
  explicit Replay(const JobConfig& config)
      : model_(config.model),
        batches_(LoadData(config).value().train.Shard(0, 1), config.training.batch_size,
                 config.training.seed * 1000003) {}
  Values Initial() const { return Clone(model_.variables()); }
  Values Gradients(const Values& at) {
    model_.Load(at);
    ComputeGradients(model_, batches_);
    return Clone(model_.Gradients());
  }

 private:
  Mlp model_;
  BatchIterator batches_;
};

void ExpectNear(const Values& actual, const Values& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_TRUE(actual[i].allclose(expected[i], 1e-6, 1e-6))
        << what << " [" << i << "] differs by " << (actual[i] - expected[i]).abs().max().item<float>();
  }
}

void ExpectEqual(const Values& actual, const Values& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) EXPECT_TRUE(actual[i].equal(expected[i])) << what << " [" << i << "]";
}

TEST(DownpourTest, FollowsItsUpdateRules) {
  JobConfig config = TinyJob("downpour", 1, 12);
  config.local.n_fetch = 2;
  config.local.n_push = 3;
  config.training.optimizer.Clear();
  config.training.optimizer.set_kind("adagrad");
  config.training.optimizer.set_learning_rate(0.1);
  auto recorders = RunRecorded(config);

  Replay replay(config);
  Values global = replay.Initial();
  for (auto& g : global) g.set_requires_grad(true);
  torch::optim::Adagrad ps(global, torch::optim::AdagradOptions(0.1).initial_accumulator_value(0.1).eps(1e-10));
  Values local, pending;
  for (const auto& g : global) pending.push_back(torch::zeros_like(g));
  for (int step = 0; step < 12; ++step) {
    if (step % 2 == 0) local = Clone(global);  // fetch
    Values gradients = replay.Gradients(local);
    for (size_t i = 0; i < local.size(); ++i) {
      pending[i] += gradients[i];
      local[i] -= 0.05 * gradients[i];
    }
    if ((step + 1) % 3 == 0) {  // push the summed gradients; the ps applies Adagrad
      for (size_t i = 0; i < global.size(); ++i) global[i].mutable_grad() = pending[i].clone();
      ps.step();
      for (auto& p : pending) p.zero_();
    }
  }
  ASSERT_EQ(recorders[0]->global.size(), 4u);
  ExpectNear(recorders[0]->global.back(), global, "global");
  ExpectNear(recorders[0]->local.back(), local, "local");
}

TEST(DownpourTest, APushRightBeforeAFetchBringsTheValuesBackInOneRoundTrip) {
  for (const bool fetch_after_push : {true, false}) {
    JobConfig config = TinyJob("downpour", 1, 12);
    config.local.n_push = 4;
    config.local.n_fetch = fetch_after_push ? 4 : 3;
    const std::vector<int64_t> after_step = RequestsAfterEachStep(config);
    ASSERT_EQ(after_step.size(), 12u);
    // Steps 4-7 hold one push (step 7) and, with n_fetch 3, a fetch at
    // step 6; with n_fetch 4, the fetch at step 4 came with step 3's push.
    const int64_t requests = after_step[7] - after_step[3];
    EXPECT_EQ(requests, fetch_after_push ? 1 : 2) << "n_fetch " << config.local.n_fetch;
  }
}

TEST(ElasticAverageTest, FollowsTensorFlowsUpdateRulesWithTheRhoPenalty) {
  JobConfig config = TinyJob("easgd", 1, 12);
  config.local.tau = 3;
  config.local.alpha = 0.4;
  config.local.rho = 0.1;
  auto recorders = RunRecorded(config);

  Replay replay(config);
  Values centre = replay.Initial(), x = replay.Initial(), seen = replay.Initial();
  for (int step = 0; step < 12; ++step) {
    Values gradients = replay.Gradients(x);
    for (size_t i = 0; i < x.size(); ++i) x[i] -= 0.05 * (gradients[i] + 0.1 * (x[i] - seen[i]));
    if ((step + 1) % 3 == 0) {
      // TensorFlow's ElasticAverageOptimizer: the local copy of the centre
      // is assigned the global centre, then both move by alpha times the
      // difference; the penalty rho * (x - seen) uses that copy until the
      // next exchange, without this worker's push.
      seen = Clone(centre);
      for (size_t i = 0; i < x.size(); ++i) {
        torch::Tensor d = 0.4 * (x[i] - seen[i]);
        x[i] -= d;
        centre[i] += d;
      }
    }
  }
  ASSERT_EQ(recorders[0]->global.size(), 4u);
  ExpectNear(recorders[0]->global.back(), centre, "centre");
  ExpectNear(recorders[0]->local.back(), x, "local");
}

// The exchange is one request: the ps moves the centre and answers with it
// as it was (it took two, a read and an add, with another worker's exchange
// free to land between them).
TEST(ElasticAverageTest, AnExchangeIsOneRoundTrip) {
  JobConfig config = TinyJob("easgd", 1, 12);
  config.local.tau = 4;
  const std::vector<int64_t> after_step = RequestsAfterEachStep(config);
  ASSERT_EQ(after_step.size(), 12u);
  EXPECT_EQ(after_step[7] - after_step[3], 1);  // steps 4-7: the exchange at step 7
  EXPECT_EQ(after_step[6] - after_step[3], 0);  // local steps send nothing
}

TEST(ElasticAverageTest, AlphaDefaultsToPointNineOverTheWorkers) {
  JobConfig config = TinyJob("easgd", 1, 3);
  config.local.tau = 3;
  auto recorders = RunRecorded(config);
  Replay replay(config);
  Values centre = replay.Initial(), x = replay.Initial();
  for (int step = 0; step < 3; ++step) {
    Values gradients = replay.Gradients(x);
    for (size_t i = 0; i < x.size(); ++i) x[i] -= 0.05 * gradients[i];
  }
  for (size_t i = 0; i < x.size(); ++i) centre[i] += 0.9 * (x[i] - centre[i]);
  ExpectNear(recorders[0]->global.back(), centre, "centre");
}

// TensorFlow's ModelAverageOptimizer test, with 2 workers: right after each
// averaging, local == global == the mean of what the workers sent, exactly.
TEST(ModelAverageTest, AfterEachAveragingLocalEqualsGlobalEqualsTheMean) {
  JobConfig config = TinyJob("model_average", 2, 14);
  config.local.warmup_steps = 1;
  config.local.interval_steps = 3;
  auto recorders = RunRecorded(config);
  ASSERT_EQ(AveragingRounds(config.local, 14, 2), 3);
  for (const auto& r : recorders) {
    ASSERT_EQ(r->sent.size(), 3u);
    ASSERT_EQ(r->local.size(), 3u);
  }
  for (size_t round = 0; round < 3; ++round) {
    Values mean;
    for (size_t i = 0; i < recorders[0]->sent[round].size(); ++i) {
      mean.push_back((recorders[0]->sent[round][i] + recorders[1]->sent[round][i]).div(2));
    }
    EXPECT_FALSE(recorders[0]->sent[round][0].equal(recorders[1]->sent[round][0])) << "the workers trained alike";
    const std::string at = "round " + std::to_string(round);
    ExpectEqual(recorders[0]->global[round], mean, at + ": global vs mean");
    ExpectEqual(recorders[0]->local[round], mean, at + ": worker 0's local vs mean");
    ExpectEqual(recorders[1]->local[round], mean, at + ": worker 1's local vs mean");
  }
}

TEST(ModelAverageTest, BlockMomentumFollowsBmuf) {
  JobConfig config = TinyJob("model_average", 1, 6);
  config.local.interval_steps = 2;
  config.local.block_momentum = 0.5;
  config.local.block_learning_rate = 0.8;
  auto recorders = RunRecorded(config);

  Replay replay(config);
  Values global = replay.Initial(), block;
  for (const auto& g : global) block.push_back(torch::zeros_like(g));
  for (int round = 0; round < 3; ++round) {
    Values x = Clone(global);
    for (int k = 0; k < 2; ++k) {
      Values gradients = replay.Gradients(x);
      for (size_t i = 0; i < x.size(); ++i) x[i] -= 0.05 * gradients[i];
    }
    for (size_t i = 0; i < x.size(); ++i) {  // one worker: the average is its copy
      block[i] = 0.5 * block[i] + 0.8 * (global[i] - x[i]);
      global[i] -= block[i];
    }
  }
  ASSERT_EQ(recorders[0]->global.size(), 3u);
  ExpectNear(recorders[0]->global.back(), global, "global");
  ExpectNear(recorders[0]->local.back(), global, "local after the last round");
}

TEST(ModelAverageTest, ScheduleCoversEachWorkersShare) {
  LocalReplicaConfig local;
  local.interval_steps = 8;
  EXPECT_EQ(AveragingRounds(local, 4688, 2), 293);  // 2344 steps each
  local.warmup_steps = 4;
  EXPECT_EQ(AveragingRounds(local, 20, 2), 4 + 1);  // 10 each: 4 single steps, then one round of 8
  EXPECT_EQ(LocalStepsInRound(local, 3), 1);
  EXPECT_EQ(LocalStepsInRound(local, 4), 8);
}

struct ModeCase {
  const char* mode;
  double min_accuracy;
};

class LocalReplicaTrainingTest : public ::testing::TestWithParam<ModeCase> {};

TEST_P(LocalReplicaTrainingTest, TwoWorkersInProcessLearn) {
  auto report = TrainInProcess(QuickJob(GetParam().mode), InProcOptions{}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_GT(report->test_accuracy, GetParam().min_accuracy);
  EXPECT_GT(report->bytes_sent, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, LocalReplicaTrainingTest,
                         ::testing::Values(ModeCase{"downpour", 0.70}, ModeCase{"model_average", 0.75},
                                           ModeCase{"easgd", 0.75}),
                         [](const auto& info) { return std::string(info.param.mode); });

TEST(LocalReplicaTrainingTest, ModelAveragingEveryEightStepsSendsAnEighthOfAsyncsBytes) {
  JobConfig config = QuickJob("async");
  config.training.epochs = 1;
  auto async = TrainInProcess(config, InProcOptions{}, nullptr);
  config.training.mode = "model_average";
  auto averaged = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(async.ok() && averaged.ok());
  auto per_epoch = [](const TrainReport& r, int64_t bytes) { return bytes / r.epochs_trained; };
  // Tensors: one push of the model per 8 local steps, against one per step.
  EXPECT_NEAR(per_epoch(*averaged, averaged->tensor_bytes_sent) / per_epoch(*async, async->tensor_bytes_sent), 0.125,
              1e-9);
  // Everything, headers and the barrier's small messages included.
  EXPECT_NEAR(per_epoch(*averaged, averaged->bytes_sent) / per_epoch(*async, async->bytes_sent), 0.125, 0.0005);
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

// Runs a model-averaging job as separate processes and returns the chief's
// result file. With `kill_at_step` > 0, worker 1 is killed with SIGKILL once
// its metrics show that many local steps, and started again.
std::string RunProcessJob(const JobConfig& config, const std::string& name, int64_t kill_at_step) {
  ProcessCluster cluster(name, 1, 2, config);
  pid_t ps = cluster.Start("server", "ps:0");
  pid_t chief = cluster.Start("worker", "worker:0", "chief.err");
  pid_t worker = cluster.Start("worker", "worker:1", "worker1.err");
  if (kill_at_step > 0) {
    const int64_t at = WaitForStep(cluster.MetricsFile(1), "local_step", kill_at_step);
    EXPECT_GE(at, kill_at_step) << "training did not get under way";
    EXPECT_EQ(WaitFor(chief, absl::ZeroDuration()), -1) << "the job ended before the kill";
    EXPECT_EQ(kill(worker, SIGKILL), 0);
    waitpid(worker, nullptr, 0);
    worker = cluster.Start("worker", "worker:1", "worker1_restarted.err");
  }
  const int chief_status = WaitFor(chief, absl::Seconds(120));
  const int worker_status = WaitFor(worker, absl::Seconds(10));
  kill(ps, SIGTERM);
  WaitFor(ps, absl::Seconds(10));
  for (pid_t pid : {chief, worker, ps}) kill(pid, SIGKILL);
  EXPECT_TRUE(WIFEXITED(chief_status) && WEXITSTATUS(chief_status) == 0) << cluster.ReadFile("chief.err");
  EXPECT_TRUE(WIFEXITED(worker_status) && WEXITSTATUS(worker_status) == 0)
      << cluster.ReadFile(kill_at_step > 0 ? "worker1_restarted.err" : "worker1.err");
  return cluster.ReadFile("worker:0.json");
}

double TestAccuracy(const std::string& result) {
  return result.empty() ? 0 : nlohmann::json::parse(result).at("test_accuracy").get<double>();
}

TEST(WorkerRestartTest, AKilledWorkerRestartsRejoinsAndTheJobEndsAsAnUndisturbedOne) {
  JobConfig config = QuickJob("model_average");
  config.data.train_examples = 30000;
  config.data.test_examples = 0;  // all 10,000: a point is 100 examples, well above the noise
  config.training.epochs = 3;
  // 30,000 examples, batch 64, 2 workers: about 700 local steps each; the
  // kill comes a third of the way in.
  const double undisturbed = TestAccuracy(RunProcessJob(config, "shoal_calm", 0));
  const double restarted = TestAccuracy(RunProcessJob(config, "shoal_restart", 250));
  std::printf("test accuracy: undisturbed %.4f, with worker 1 killed and restarted %.4f\n", undisturbed, restarted);
  EXPECT_GT(undisturbed, 0.8);
  // Every round after the kill needed worker 1's values, so the job could
  // only finish because the restarted worker rejoined.
  EXPECT_NEAR(restarted, undisturbed, 0.01);
}

}  // namespace
}  // namespace shoal
