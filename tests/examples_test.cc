// The examples in examples/, run as a user would run them: the PyTorch
// script saves its CNN with BatchNorm and dropout, and shoal trains the file
// with the example's config (on a subset, so that the test is quick).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "saved_values.h"
#include "temp_dir.h"
#include "shoal/config/config.h"
#include "shoal/session/local_cluster.h"
#include "source_paths.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;

// The command that has examples/pytorch/cnn_model.py save its CNN to `model`.
std::string ScriptExampleCnn(const fs::path& model) {
  return std::string("/usr/bin/python3 ") + SHOAL_SOURCE_DIR + "/examples/pytorch/cnn_model.py --out " +
         model.string() + " > /dev/null";
}

TEST(PyTorchExampleTest, TheScriptedCnnTrainsAndItsBatchNormStatisticsReachThePs) {
  const fs::path dir = FreshTempDir("shoal_example_", "pytorch");
  const fs::path model = dir / "cnn.pt";
  const std::string command = ScriptExampleCnn(model);
  ASSERT_EQ(std::system(command.c_str()), 0)
      << command << " failed: it needs Debian's python3-torch, which scripts/bootstrap.sh installs";
  auto config = LoadJobConfig(std::string(SHOAL_SOURCE_DIR) + "/examples/pytorch/cnn.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  config->model.path = model.string();
  config->data.train_examples = 8000;
  config->data.test_examples = 1000;
  config->training.epochs = 1;
  config->checkpoint.dir = (dir / "ckpt").string();
  auto report = TrainInProcess(*config, InProcOptions{}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_GT(report->test_accuracy, 0.7);
  const auto saved = SavedValues(report->last_checkpoint);
  ASSERT_TRUE(saved.count("bn1.running_mean") && saved.count("bn2.num_batches_tracked"));
  EXPECT_GT(saved.at("bn1.running_mean").abs().max().item<float>(), 1e-3)
      << "the chief's statistics were never published";
  EXPECT_EQ(saved.at("bn2.num_batches_tracked").scalar_type(), torch::kInt64);
  EXPECT_GT(saved.at("bn2.num_batches_tracked").item<int64_t>(), 0);
  fs::remove_all(dir);
}

// The gated example: the same scripted CNN, a built-in CNN and an MLP under
// one master, each network on its own worker task.
TEST(PyTorchExampleTest, TheGatedExampleTrainsThreeKindsOfNetworkUnderOneMaster) {
  const fs::path dir = FreshTempDir("shoal_example_", "gated");
  const fs::path model = dir / "cnn.pt";
  const std::string command = ScriptExampleCnn(model);
  ASSERT_EQ(std::system(command.c_str()), 0) << command << " failed";
  auto config = LoadJobConfig(std::string(SHOAL_SOURCE_DIR) + "/examples/pytorch/gated.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->gated.networks.size(), 3u);
  config->gated.networks[0].model->path = model.string();
  config->data.train_examples = 3000;
  config->data.test_examples = 1000;
  config->training.epochs = 1;
  config->checkpoint.dir = (dir / "ckpt").string();
  auto report = TrainInProcess(*config, InProcOptions{}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_GT(report->test_accuracy, 0.65);  // chance is 0.1
  ASSERT_EQ(report->network_test_accuracies.size(), 3u);
  const auto saved = SavedValues(report->last_checkpoint);
  ASSERT_TRUE(saved.count("net_0/bn2.num_batches_tracked") && saved.count("net_1/bn_2/num_batches_tracked"));
  EXPECT_EQ(saved.at("net_0/bn2.num_batches_tracked").item<int64_t>(), report->global_step);
  EXPECT_EQ(saved.at("net_1/bn_2/num_batches_tracked").item<int64_t>(), report->global_step);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shoal
