// Synchronous training: the exact cases of TensorFlow's SyncReplicasOptimizer
// tests on the accumulator primitives, the N-workers == one-big-batch
// equivalence, and end-to-end runs.
#include "shoal/strategy/sync_strategy.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "shoal/checkpoint/checkpoint.h"
#include "shoal/session/local_cluster.h"
#include "process_helpers.h"
#include "quick_job.h"
#include "step_recorder.h"
#include "temp_dir.h"
#include "shoal/transport/inproc/inproc_transport.h"

namespace shoal {
namespace {

// One ps task in-process with var_0 = [0] and var_1 = [1] under SGD(2.0), as
// in TensorFlow's sync_replicas_optimizer_test.
class SyncReplicasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = transport_.Serve("inproc:ps:0", &service_).value();
    cluster_ = ClusterSpec::Local(1, 3);
    auto placement = std::make_shared<const Placement>(
        Placement::Create({{"var_0", {1}}, {"var_1", {1}}}, cluster_, {}).value());
    client_ = Client::Create(cluster_, &transport_, placement, ClientOptions{absl::Seconds(5)}).value();
    wire::OptimizerConfig sgd;
    sgd.set_kind("sgd");
    sgd.set_learning_rate(2.0);
    ASSERT_TRUE(client_->CreateVariables({{"var_0", torch::zeros({1}), sgd}, {"var_1", torch::ones({1}), sgd}}).ok());
  }

  // Worker w's gradients, as in the TensorFlow test: 0.1 + 0.2 w and 0.9 + 0.2 w.
  // With apply_at > 0 the server applies the step when the gradient that
  // completes it arrives, as SyncStrategy runs it.
  absl::StatusOr<int> Push(int w, int64_t local_step, int apply_at = 0) {
    return client_->Accumulate(names_, {torch::full({1}, 0.1f + 0.2f * w), torch::full({1}, 0.9f + 0.2f * w)},
                               local_step, Worker(w), apply_at);
  }
  static std::string Worker(int w) { return TaskId{"worker", w}.ToString(); }
  absl::Status Apply(int replicas, int64_t new_step, absl::Duration timeout = absl::Seconds(2)) {
    return client_->ApplyAccumulated(names_, replicas, new_step, timeout, {Worker(0), Worker(1), Worker(2)});
  }
  float Value(const std::string& name) { return client_->Read({name}).value()[0].item<float>(); }

  InProcNetwork network_;
  InProcTransport transport_{&network_};
  VariableService service_{VariableServiceOptions{"/job:ps/task:0"}};
  std::unique_ptr<ServerHandle> server_;
  ClusterSpec cluster_ = ClusterSpec::Local(1, 1);
  std::unique_ptr<Client> client_;
  const std::vector<std::string> names_ = {"var_0", "var_1"};
};

TEST_F(SyncReplicasTest, TwoWorkersAverageTheirGradients) {
  ASSERT_EQ(Push(0, 0).value(), 0);
  ASSERT_EQ(Push(1, 0).value(), 0);
  ASSERT_TRUE(Apply(2, 1).ok());
  EXPECT_FLOAT_EQ(Value("var_0"), 0.0f - (0.1f + 0.3f) / 2 * 2.0f);
  EXPECT_FLOAT_EQ(Value("var_1"), 1.0f - (0.9f + 1.1f) / 2 * 2.0f);
  ASSERT_EQ(Push(0, 1).value(), 0);
  ASSERT_EQ(Push(1, 1).value(), 0);
  ASSERT_TRUE(Apply(2, 2).ok());
  EXPECT_FLOAT_EQ(Value("var_0"), -0.4f - (0.1f + 0.3f) / 2 * 2.0f);
  EXPECT_FLOAT_EQ(Value("var_1"), -1.0f - (0.9f + 1.1f) / 2 * 2.0f);
}

TEST_F(SyncReplicasTest, ThreeWorkersWithOneBackupDropTheLateGradient) {
  ASSERT_EQ(Push(0, 0).value(), 0);
  ASSERT_EQ(Push(1, 0).value(), 0);
  ASSERT_TRUE(Apply(2, 1).ok());
  EXPECT_FLOAT_EQ(Value("var_0"), -0.4f);
  EXPECT_FLOAT_EQ(Value("var_1"), -1.0f);
  // Worker 2 is late: its step-0 gradients are stale and dropped.
  EXPECT_EQ(Push(2, 0).value(), 2);
  // The next step is made by workers 1 and 2.
  ASSERT_EQ(Push(1, 1).value(), 0);
  ASSERT_EQ(Push(2, 1).value(), 0);
  ASSERT_TRUE(Apply(2, 2).ok());
  EXPECT_FLOAT_EQ(Value("var_0"), -0.4f - (0.3f + 0.5f) / 2 * 2.0f);
  EXPECT_FLOAT_EQ(Value("var_1"), -1.0f - (1.1f + 1.3f) / 2 * 2.0f);
}

TEST_F(SyncReplicasTest, ApplyingAStepTwiceChangesNothing) {
  ASSERT_TRUE(Push(0, 0).ok());
  ASSERT_TRUE(Push(1, 0).ok());
  ASSERT_TRUE(Apply(2, 1).ok());
  ASSERT_TRUE(Apply(2, 1).ok());
  EXPECT_FLOAT_EQ(Value("var_0"), -0.4f);
}

// A step counts workers, not messages: one worker pushing twice (a restarted
// worker sending its step again) does not complete a two-worker step alone.
TEST_F(SyncReplicasTest, OneWorkerPushingTwiceDoesNotCompleteAStep) {
  ASSERT_EQ(Push(0, 0, /*apply_at=*/2).value(), 0);
  EXPECT_EQ(Push(0, 0, 2).value(), 2);  // both tensors dropped as a repeat
  auto pending = client_->ReadAtStep(names_, 1, absl::ZeroDuration());
  ASSERT_TRUE(pending.ok()) << pending.status();
  EXPECT_FALSE(pending->ready);
  EXPECT_FLOAT_EQ(Value("var_0"), 0.0f);
  EXPECT_FALSE(Apply(2, 1, absl::Milliseconds(100)).ok());  // the chief, too, sees 1 of 2
  ASSERT_EQ(Push(1, 0, 2).value(), 0);
  EXPECT_FLOAT_EQ(Value("var_0"), -0.4f);  // worker 0's gradient counted once
}

TEST_F(SyncReplicasTest, AnAccumulateThatNamesNoWorkerIsRefused) {
  auto pushed = client_->Accumulate(names_, {torch::ones({1}), torch::ones({1})}, 0, "");
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(pushed.status().message().find("names no worker"), std::string::npos) << pushed.status();
}

TEST_F(SyncReplicasTest, AMissingWorkerIsNamedAfterTheDeadline) {
  ASSERT_TRUE(Push(0, 0).ok());
  const absl::Time start = absl::Now();
  absl::Status status = Apply(2, 1, absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(status.message().find("only 1 of 2"), std::string::npos) << status;
  EXPECT_NE(status.message().find("/job:worker/task:1"), std::string::npos) << status;
  EXPECT_EQ(status.message().find("/job:worker/task:0"), std::string::npos) << status;
  EXPECT_FLOAT_EQ(Value("var_0"), 0.0f);  // nothing applied
}

TEST_F(SyncReplicasTest, NanGradientIsRefusedAndNotAccumulated) {
  torch::Tensor nan = torch::full({1}, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(client_->Accumulate(names_, {nan, torch::ones({1})}, 0, Worker(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Push(0, 0).ok());
  ASSERT_TRUE(Push(1, 0).ok());
  ASSERT_TRUE(Apply(2, 1).ok());
  EXPECT_FLOAT_EQ(Value("var_0"), -0.4f);
}

TEST_F(SyncReplicasTest, TheGradientThatCompletesAStepAppliesIt) {
  ASSERT_EQ(Push(0, 0, /*apply_at=*/2).value(), 0);
  auto early = client_->ReadAtStep(names_, 1, absl::ZeroDuration());
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_FALSE(early->ready);
  EXPECT_TRUE(early->values.empty());
  EXPECT_EQ(early->heard_from, std::vector<std::string>{Worker(0)});
  EXPECT_FLOAT_EQ(Value("var_0"), 0.0f);  // half a step applies nothing
  ASSERT_EQ(Push(1, 0, 2).value(), 0);
  auto after = client_->ReadAtStep(names_, 1, absl::ZeroDuration());
  ASSERT_TRUE(after.ok() && after->ready) << after.status();
  EXPECT_EQ(after->step, 1);
  EXPECT_FLOAT_EQ(after->values[0].item<float>(), -0.4f);
  EXPECT_FLOAT_EQ(after->values[1].item<float>(), -1.0f);
  ASSERT_EQ(Push(0, 1, 2).value(), 0);
  ASSERT_EQ(Push(1, 1, 2).value(), 0);
  EXPECT_FLOAT_EQ(Value("var_0"), -0.8f);
  EXPECT_FLOAT_EQ(Value("var_1"), -3.0f);
}

TEST_F(SyncReplicasTest, WithABackupTheStragglersGradientIsDroppedAndItReadsTheNewStep) {
  ASSERT_EQ(Push(0, 0, 2).value(), 0);
  ASSERT_EQ(Push(1, 0, 2).value(), 0);
  EXPECT_EQ(Push(2, 0, 2).value(), 2);  // late: stale, dropped, nothing applied
  EXPECT_FLOAT_EQ(Value("var_0"), -0.4f);
  auto next = client_->ReadAtStep(names_, 1, absl::Seconds(1));
  ASSERT_TRUE(next.ok() && next->ready) << next.status();
  EXPECT_EQ(next->step, 1);
  ASSERT_EQ(Push(1, 1, 2).value(), 0);
  ASSERT_EQ(Push(2, 1, 2).value(), 0);
  EXPECT_FLOAT_EQ(Value("var_0"), -0.4f - (0.3f + 0.5f) / 2 * 2.0f);
  EXPECT_FLOAT_EQ(Value("var_1"), -1.0f - (1.1f + 1.3f) / 2 * 2.0f);
}

TEST_F(SyncReplicasTest, AReadAtStepWaitsForTheStepsLastGradient) {
  ASSERT_TRUE(Push(0, 0, 2).ok());
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(Push(1, 0, 2).ok());
  });
  auto next = client_->ReadAtStep(names_, 1, absl::Seconds(2));
  late.join();
  ASSERT_TRUE(next.ok() && next->ready) << next.status();
  EXPECT_FLOAT_EQ(next->values[0].item<float>(), -0.4f);
}

TEST_F(SyncReplicasTest, BadAccumulateAndReadAtStepArgumentsChangeNothing) {
  EXPECT_EQ(Push(0, 0, /*apply_at=*/-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->ReadAtStep(names_, 0, absl::ZeroDuration()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->ReadAtStep({"var_0", "nope"}, 1, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(Push(0, 0, 2).ok());  // the refused gradient was not counted: this one does not complete the step
  EXPECT_FLOAT_EQ(Value("var_0"), 0.0f);
  ASSERT_TRUE(Push(1, 0, 2).ok());
  EXPECT_FLOAT_EQ(Value("var_0"), -0.4f);
}

// Counters ride with an accumulate to the counter task (a worker's place in
// its data, in the same call as its gradient): bumped once the gradients
// are taken, kept or dropped as stale, and not at all by a refused request.
TEST_F(SyncReplicasTest, AnAccumulateBumpsItsCountersOnceTakenAndNeverWhenRefused) {
  const torch::Tensor g = torch::ones({1});
  auto counter = [&] { return client_->AddToCounter("position", 0).value(); };
  ASSERT_EQ(client_->Accumulate(names_, {g, g}, 0, Worker(0), 2, {{"position", 30}}).value(), 0);
  EXPECT_EQ(counter(), 30);
  ASSERT_EQ(client_->Accumulate(names_, {g, g}, 0, Worker(1), 2, {{"position", 30}}).value(), 0);
  EXPECT_EQ(counter(), 60);
  // Stale: dropped, yet its examples were drawn and sent.
  ASSERT_EQ(client_->Accumulate(names_, {g, g}, 0, Worker(2), 2, {{"position", 10}}).value(), 2);
  EXPECT_EQ(counter(), 70);
  const float applied = Value("var_0");

  const torch::Tensor nan = torch::full({1}, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(client_->Accumulate(names_, {nan, g}, 1, Worker(0), 2, {{"position", 30}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto unnamed = client_->Accumulate(names_, {g, g}, 1, Worker(0), 2, {{"", 30}});
  EXPECT_EQ(unnamed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unnamed.status().message().find("counter that has no name"), std::string::npos) << unnamed.status();
  auto unnamed_apply = client_->ApplyGradients(names_, {g, g}, {{"", 1}});
  EXPECT_EQ(unnamed_apply.status().code(), absl::StatusCode::kInvalidArgument) << unnamed_apply.status();
  EXPECT_EQ(counter(), 70);
  EXPECT_FLOAT_EQ(Value("var_0"), applied);  // nothing applied by the refused apply
  // Nothing of the refused accumulates was counted: worker 0's and worker
  // 1's next gradients complete step 1.
  ASSERT_EQ(client_->Accumulate(names_, {g, g}, 1, Worker(0), 2).value(), 0);
  EXPECT_FLOAT_EQ(Value("var_0"), applied);
  ASSERT_EQ(client_->Accumulate(names_, {g, g}, 1, Worker(1), 2).value(), 0);
  EXPECT_FLOAT_EQ(Value("var_0"), applied - 2.0f);
}

// A synchronous step is the accumulate (with the worker's place in its data
// and, from the chief, the global step of the step before) and the
// barrier's read. It was two more: the place, and the chief's global step
// after the barrier, went in requests of their own. The last step's global
// step goes when training ends.
TEST(SyncTrainingTest, AStepIsTheAccumulateAndTheBarriersRead) {
  JobConfig config = QuickJob("sync");
  config.cluster.ps = 1;
  config.cluster.workers = 1;
  config.data.train_examples = 256;
  config.training.batch_size = 32;
  config.training.max_steps = 6;
  const std::filesystem::path dir = FreshTempDir("shoal_", "sync_requests");
  config.checkpoint.dir = dir.string();
  TrainReport report;
  const std::vector<int64_t> after_step = RequestsAfterEachStep(config, &report);
  ASSERT_EQ(after_step.size(), 6u);
  for (size_t step = 1; step < after_step.size(); ++step) {
    EXPECT_EQ(after_step[step] - after_step[step - 1], 2) << "step " << step;
  }
  EXPECT_EQ(report.global_step, 6);
  EXPECT_EQ(ReadCheckpointIndex(report.last_checkpoint).value().step, 6);
  std::filesystem::remove_all(dir);
}

// N workers with batch b, aggregated synchronously, take the same steps as
// one worker with batch N*b: the mean of per-worker mean gradients is the
// mean gradient of the whole batch.
TEST(SyncEquivalenceTest, TwoWorkersMatchOneWorkerWithTheCombinedBatch) {
  constexpr int kWorkers = 2, kBatch = 8, kSteps = 5;
  MlpConfig model_config;
  model_config.layers = {20, 16, 3};
  torch::manual_seed(3);
  std::vector<torch::Tensor> inputs, labels;
  for (int step = 0; step < kSteps; ++step) {
    inputs.push_back(torch::randn({kWorkers * kBatch, 20}));
    labels.push_back(torch::randint(0, 3, {kWorkers * kBatch}, torch::kInt64));
  }

  // One worker, plain libtorch SGD on the whole batch.
  Mlp single(model_config);
  torch::optim::SGD sgd(single.variables(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < kSteps; ++step) {
    sgd.zero_grad();
    CrossEntropyLoss(single.Forward(inputs[step]), labels[step]).backward();
    sgd.step();
  }

  // Two workers through shoal's accumulators, each on its half, the step
  // applied by the server when the second gradient arrives.
  InProcNetwork network;
  InProcTransport transport(&network);
  VariableService service(VariableServiceOptions{"/job:ps/task:0"});
  auto server = transport.Serve("inproc:ps:0", &service).value();
  ClusterSpec cluster = ClusterSpec::Local(1, kWorkers);
  Mlp init(model_config);
  auto placement = std::make_shared<const Placement>(Placement::Create(init.VariableSpecs(), cluster, {}).value());
  auto client = Client::Create(cluster, &transport, placement).value();
  wire::OptimizerConfig optimizer;
  optimizer.set_kind("sgd");
  optimizer.set_learning_rate(0.1);
  std::vector<VariableInit> inits;
  for (size_t i = 0; i < init.variables().size(); ++i) {
    inits.push_back({init.variable_names()[i], init.variables()[i].detach(), optimizer});
  }
  ASSERT_TRUE(client->CreateVariables(inits).ok());
  const auto& names = init.variable_names();
  for (int step = 0; step < kSteps; ++step) {
    for (int w = 0; w < kWorkers; ++w) {
      Mlp replica(model_config);
      replica.Load(client->Read(names).value());
      CrossEntropyLoss(replica.Forward(inputs[step].narrow(0, w * kBatch, kBatch)),
                       labels[step].narrow(0, w * kBatch, kBatch))
          .backward();
      // As SyncStrategy sends them: the second gradient applies the step.
      ASSERT_EQ(client->Accumulate(names, replica.Gradients(), step, TaskId{"worker", w}.ToString(), kWorkers).value(), 0);
    }
    auto next = client->ReadAtStep(names, step + 1, absl::ZeroDuration());
    ASSERT_TRUE(next.ok() && next->ready) << next.status();
  }
  auto values = client->Read(names).value();
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_TRUE(values[i].allclose(single.variables()[i].detach(), 1e-5, 1e-5)) << names[i];
  }
}

TEST(SyncTrainingTest, TwoWorkersInProcessLearn) {
  auto report = TrainInProcess(QuickJob("sync"), InProcOptions{}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->global_step, 2 * 12000 / (64 * 2) + 1);
  EXPECT_EQ(report->stale_gradients_dropped, 0);
  EXPECT_GT(report->test_accuracy, 0.75);
}

TEST(SyncTrainingTest, ThreeWorkersWithABackupLearn) {
  JobConfig config = QuickJob("sync");
  config.cluster.workers = 3;
  config.training.replicas_to_aggregate = 2;
  auto report = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_GT(report->test_accuracy, 0.75);
}

TEST(SyncTrainingTest, MoreReplicasThanWorkersIsRefused) {
  JobConfig config = QuickJob("sync");
  config.training.replicas_to_aggregate = 3;
  auto report = TrainInProcess(config, InProcOptions{}, nullptr);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(report.status().message().find("replicas_to_aggregate"), std::string::npos) << report.status();
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

TEST(SyncTrainingTest, AKilledWorkerProcessFailsTheStepNamingItInsteadOfHanging) {
  JobConfig config = QuickJob("sync");
  config.training.epochs = 100;  // far more than the test lets it run
  config.training.sync_timeout_s = 3;
  ProcessCluster cluster("shoal_kill", 1, 2, config);
  pid_t ps = cluster.Start("server", "ps:0");
  pid_t chief = cluster.Start("worker", "worker:0", "chief.err");
  pid_t worker = cluster.Start("worker", "worker:1");
  // Some synchronous steps done, then the kill.
  ASSERT_GE(WaitForStep(cluster.MetricsFile(1), "local_step", 30), 30) << cluster.ReadFile("chief.err");
  ASSERT_EQ(WaitFor(chief, absl::ZeroDuration()), -1) << "the job ended before the kill";
  ASSERT_EQ(kill(worker, SIGKILL), 0);
  waitpid(worker, nullptr, 0);
  const absl::Time killed = absl::Now();
  int status = WaitFor(chief, absl::Seconds(30));
  const absl::Duration took = absl::Now() - killed;
  kill(ps, SIGTERM);
  WaitFor(ps, absl::Seconds(10));
  if (status == -1) kill(chief, SIGKILL);
  ASSERT_NE(status, -1) << "the chief hung after a worker died";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
  EXPECT_LT(took, absl::Seconds(15));
  const std::string message = cluster.ReadFile("chief.err");
  EXPECT_NE(message.find("missing /job:worker/task:1"), std::string::npos) << message;
}

// With a backup (3 workers, 2 gradients a step), a killed worker costs
// nothing: the steps go on with the other two and the job ends.
TEST(SyncTrainingTest, AKilledBackupWorkerLeavesTheStepsGoingOn) {
  JobConfig config = QuickJob("sync");
  config.training.replicas_to_aggregate = 2;
  config.training.max_steps = 400;
  config.transport.rpc_timeout_s = 5;  // how long the chief waits for the dead worker at the end
  ProcessCluster cluster("shoal_kill_backup", 1, 3, config);
  pid_t ps = cluster.Start("server", "ps:0");
  pid_t chief = cluster.Start("worker", "worker:0", "chief.err");
  pid_t worker = cluster.Start("worker", "worker:1");
  pid_t backup = cluster.Start("worker", "worker:2");
  // Some synchronous steps done, and far from the 400th, then the kill.
  const int64_t at = WaitForStep(cluster.MetricsFile(0), "global_step", 30);
  ASSERT_GE(at, 30) << cluster.ReadFile("chief.err");
  ASSERT_LT(at, 300);
  ASSERT_EQ(kill(backup, SIGKILL), 0);
  waitpid(backup, nullptr, 0);
  const int status = WaitFor(chief, absl::Seconds(90));
  WaitFor(worker, absl::Seconds(10));
  for (pid_t pid : {chief, worker, ps}) kill(pid, SIGKILL);
  WaitFor(ps, absl::Seconds(10));
  ASSERT_NE(status, -1) << "the chief hung after a backup worker died";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cluster.ReadFile("chief.err");
  const std::string result = cluster.ReadFile("worker:0.json");
  EXPECT_NE(result.find("\"global_step\": 400"), std::string::npos) << result;
  EXPECT_NE(result.find("\"unfinished_workers\": 1"), std::string::npos) << result;
}

}  // namespace
}  // namespace shoal
