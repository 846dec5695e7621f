// The built-in CNN: its variables, buffers and BatchNorm behaviour, its
// config, and every mode training it as processes over gRPC with its
// BatchNorm statistics shared by the mode's rule; a checkpoint brings the
// statistics back bit for bit.
#include "shoal/model/cnn.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "inproc_servers.h"
#include "quick_job.h"
#include "saved_values.h"
#include "step_recorder.h"
#include "temp_dir.h"
#include "shoal/session/local_cluster.h"
#include "shoal/session/task_runner.h"
#include "shoal/transport/inproc/inproc_transport.h"
#include "source_paths.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;

// Small enough to train in seconds on two cores: 8 and 16 channels, 32 hidden.
CnnConfig SmallCnn() {
  CnnConfig cnn;
  cnn.conv = {{8}, {16}};
  cnn.dense = {32};
  return cnn;
}

JobConfig SmallCnnJob(const std::string& mode) {
  JobConfig config = QuickJob(mode);
  config.model.kind = "cnn";
  config.model.cnn = SmallCnn();
  config.data.train_examples = 8000;
  config.data.test_examples = 1000;
  config.training.epochs = 2;
  config.training.buffer_publish_steps = 10;
  return config;
}

TEST(CnnTest, VariablesAndBuffersAreNamedPerLayerBehindTheScope) {
  Cnn cnn(SmallCnn(), 1, "worker_1/");
  EXPECT_EQ(cnn.variable_names(),
            (std::vector<std::string>{"worker_1/conv_1/kernel", "worker_1/conv_1/bias", "worker_1/bn_1/gamma",
                                      "worker_1/bn_1/beta", "worker_1/conv_2/kernel", "worker_1/conv_2/bias",
                                      "worker_1/bn_2/gamma", "worker_1/bn_2/beta", "worker_1/dense_1/kernel",
                                      "worker_1/dense_1/bias", "worker_1/dense_2/kernel", "worker_1/dense_2/bias"}));
  EXPECT_EQ(cnn.buffer_names(),
            (std::vector<std::string>{"worker_1/bn_1/moving_mean", "worker_1/bn_1/moving_variance",
                                      "worker_1/bn_1/num_batches_tracked", "worker_1/bn_2/moving_mean",
                                      "worker_1/bn_2/moving_variance", "worker_1/bn_2/num_batches_tracked"}));
  EXPECT_EQ(cnn.variables()[4].sizes(), (std::vector<int64_t>{16, 8, 3, 3}));
  EXPECT_EQ(cnn.variables()[8].sizes(), (std::vector<int64_t>{16 * 7 * 7, 32}));  // two pools: 28 -> 7
  EXPECT_EQ(cnn.buffers()[2].scalar_type(), torch::kInt64);
  EXPECT_EQ(cnn.Forward(torch::randn({5, 1, 28, 28})).sizes(), (std::vector<int64_t>{5, 10}));
  EXPECT_EQ(cnn.Forward(torch::randn({5, 784})).sizes(), (std::vector<int64_t>{5, 10}));  // flat examples too
  CnnConfig plain = SmallCnn();
  plain.batch_norm = false;
  EXPECT_TRUE(Cnn(plain, 1, "").buffer_names().empty());
}

TEST(CnnTest, TheSameSeedBuildsTheSameModelAndEvaluationIsDeterministic) {
  Cnn a(SmallCnn(), 3, ""), b(SmallCnn(), 3, ""), c(SmallCnn(), 4, "");
  for (size_t i = 0; i < a.variables().size(); ++i) EXPECT_TRUE(a.variables()[i].equal(b.variables()[i])) << i;
  EXPECT_FALSE(a.variables()[0].equal(c.variables()[0]));
  const torch::Tensor x = torch::randn({16, 1, 28, 28});
  // Training moves the BatchNorm statistics as torch.nn.BatchNorm2d does
  // (momentum 0.1 towards the batch's mean); evaluating moves nothing and
  // drops no units.
  a.Forward(x);
  const torch::Tensor conv = torch::conv2d(x, a.variables()[0], a.variables()[1], 1, 1);
  EXPECT_TRUE(a.buffers()[0].allclose(0.1 * conv.mean({0, 2, 3}), 1e-4, 1e-5));
  EXPECT_EQ(a.buffers()[2].item<int64_t>(), 1);
  a.SetTraining(false);
  const std::vector<torch::Tensor> before = a.BufferValues();
  const torch::Tensor first = a.Forward(x), second = a.Forward(x);
  EXPECT_TRUE(first.equal(second));
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(a.buffers()[i].equal(before[i])) << i;
}

TEST(CnnTest, ABadConfigNamesTheKey) {
  struct Case {
    std::string yaml, expected;
  };
  for (const Case& c : std::vector<Case>{
           {"model: {kind: cnn, conv: [{channels: 0}]}", "model.conv[0]: channels, kernel and stride must be positive"},
           {"model: {kind: cnn, conv: [{channels: 8, pool: 8}, {channels: 8, pool: 8}]}",
            "model.conv[1] leaves no image: 0 x 0"},
           {"model: {kind: cnn, conv: [{channels: 8, colour: red}]}", "unknown key 'model.conv[0].colour'"},
           {"model: {kind: cnn, conv: {channels: 8}}", "'model.conv' must be a list"},
           {"model: {kind: cnn, input_shape: [28, 28]}", "model.input_shape has 2 dimensions"},
           {"model: {kind: cnn, dropout: 1.5}", "model.dropout must be in [0, 1)"},
           {"model: {kind: cnn, dense: [0]}", "model.dense[0] = 0 must be positive"},
           {"training: {buffer_publish_steps: 0}", "'training.buffer_publish_steps' must be positive"},
       }) {
    auto config = ParseJobConfig(c.yaml);
    ASSERT_FALSE(config.ok()) << c.yaml;
    EXPECT_NE(config.status().message().find(c.expected), std::string::npos) << c.yaml << ": " << config.status();
  }
  auto parsed = ParseJobConfig(
      "model: {kind: cnn, input_shape: [1, 28, 28], conv: [{channels: 4, kernel: 5, stride: 1, padding: 2, pool: 2}],"
      " batch_norm: false, dense: [16], dropout: 0, classes: 10}");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->model.cnn.conv.size(), 1u);
  EXPECT_EQ(parsed->model.cnn.conv[0].kernel, 5);
  auto again = ParseJobConfig(JobConfigToYaml(*parsed));  // the YAML round trip keeps the layers
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->model.cnn.conv[0].padding, 2);
  EXPECT_FALSE(again->model.cnn.batch_norm);
}

// The checkpoint the job ended with: its BatchNorm buffers, by name.
std::map<std::string, torch::Tensor> SavedBuffers(const std::string& checkpoint) {
  std::map<std::string, torch::Tensor> buffers;
  for (const auto& [name, value] : SavedValues(checkpoint)) {
    if (name.find("/moving_") != std::string::npos || name.find("num_batches_tracked") != std::string::npos) {
      buffers[name] = value;
    }
  }
  return buffers;
}

// Every mode that trains one model per worker trains the CNN with BatchNorm
// as processes over gRPC and learns; the statistics on the ps are trained
// ones, counted as the mode's rule says.
class CnnModeTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CnnModeTest, TwoWorkerProcessesTrainTheCnnAndShareItsStatistics) {
  const std::string mode = GetParam();
  const fs::path dir = FreshTempDir("shoal_cnn_", mode);
  JobConfig config = SmallCnnJob(mode);
  config.checkpoint.dir = (dir / "ckpt").string();
  ASSERT_TRUE(ValidateJobConfig(config).ok()) << ValidateJobConfig(config);
  auto report = TrainInLocalProcesses(config, SHOAL_BINARY, /*show_progress=*/false);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_GT(report->test_accuracy, 0.65) << mode;  // measured 0.765-0.823 over 2 runs of each mode; chance is 0.1
  const auto buffers = SavedBuffers(report->last_checkpoint);
  ASSERT_EQ(buffers.size(), 6u);
  EXPECT_GT(buffers.at("bn_1/moving_mean").abs().max().item<float>(), 1e-3) << "statistics never published";
  EXPECT_FALSE(buffers.at("bn_2/moving_variance").equal(torch::ones({16})));
  const int64_t tracked = buffers.at("bn_1/num_batches_tracked").item<int64_t>();
  const int64_t steps = report->worker_steps;
  if (mode == "sync") {
    EXPECT_EQ(tracked, steps / 2);  // the chief's, which took every step
  } else if (mode == "model_average") {
    EXPECT_EQ(tracked, steps);  // both replicas' counts, summed
  } else {
    EXPECT_GT(tracked, 0);
    EXPECT_LE(tracked, steps);
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Modes, CnnModeTest,
                         ::testing::Values("async", "sync", "ssp", "downpour", "model_average", "easgd"),
                         [](const auto& info) { return std::string(info.param); });

// A job started over a checkpoint puts the saved statistics back on the ps
// exactly, int64 counts included.
TEST(CnnCheckpointTest, ARestoreBringsTheBuffersBackBitForBit) {
  const fs::path dir = FreshTempDir("shoal_cnn_", "restore");
  JobConfig config = SmallCnnJob("async");
  config.cluster.workers = 1;
  config.training.max_steps = 30;
  config.checkpoint.dir = (dir / "ckpt").string();
  auto report = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  const auto saved = SavedBuffers(report->last_checkpoint);
  ASSERT_EQ(saved.size(), 6u);
  EXPECT_EQ(saved.at("bn_2/num_batches_tracked").item<int64_t>(), 30);

  InProcChief chief(config, 30);
  Cnn fresh(config.model.cnn, config.model.seed, "");
  ASSERT_TRUE(InitializeOrWait(chief.context, fresh).ok());
  ASSERT_TRUE(LoadJobBuffers(chief.context, fresh).ok());  // as the driver's join does
  EXPECT_EQ(chief.context.restored_from, report->last_checkpoint);
  // The resumed chief goes on from the restored statistics, which it will
  // publish again, not from fresh ones.
  for (size_t i = 0; i < fresh.buffer_names().size(); ++i) {
    EXPECT_TRUE(fresh.buffers()[i].equal(saved.at(fresh.buffer_names()[i]))) << fresh.buffer_names()[i];
  }
  for (const auto& [name, value] : saved) {
    auto live = chief.client->Read({name});
    ASSERT_TRUE(live.ok()) << live.status();
    EXPECT_EQ((*live)[0].scalar_type(), value.scalar_type()) << name;
    EXPECT_TRUE((*live)[0].equal(value)) << name;
  }
  fs::remove_all(dir);
}

// Downpour's push before a fetch and EASGD's exchange add the BatchNorm
// statistics' drift in a call that brings the ps's statistics back: two
// calls at an exchange (the variables', the buffers'), where a read of the
// buffers made three. With one worker the ps counts every local batch.
TEST(CnnLocalReplicaTest, AnExchangeAddsTheBuffersDriftAndFetchesThemInOneCall) {
  for (const std::string mode : {"downpour", "easgd"}) {
    const fs::path dir = FreshTempDir("shoal_cnn_", mode + "_exchange");
    JobConfig config = SmallCnnJob(mode);
    config.cluster.ps = 1;
    config.cluster.workers = 1;
    config.training.max_steps = 12;
    config.local.n_push = config.local.n_fetch = config.local.tau = 4;
    config.checkpoint.dir = (dir / "ckpt").string();
    std::shared_ptr<RequestCounter> counter;
    auto report = TrainInProcess(config, InProcOptions{}, nullptr, [&](WorkerContext& context) {
      counter = std::make_shared<RequestCounter>(context.client);
      context.extra_hooks.push_back(counter);
    });
    ASSERT_TRUE(report.ok()) << report.status();
    ASSERT_EQ(counter->after_step.size(), 12u) << mode;
    EXPECT_EQ(counter->after_step[7] - counter->after_step[3], 2) << mode;  // the exchange at step 7
    EXPECT_EQ(counter->after_step[6] - counter->after_step[3], 0) << mode;  // local steps send nothing
    const auto saved = SavedBuffers(report->last_checkpoint);
    EXPECT_EQ(saved.at("bn_1/num_batches_tracked").item<int64_t>(), 12) << mode;
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace shoal
