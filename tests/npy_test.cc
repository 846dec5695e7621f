// NPY data: files numpy itself wrote read back exactly; bad files (a wrong
// dtype, Fortran order, truncation, features and labels that disagree) are
// refused naming the file; a job trains on Fashion-MNIST exported to NPY by
// the example script.
#include "shoal/data/npy.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "quick_job.h"
#include "temp_dir.h"
#include "shoal/data/data_source.h"
#include "shoal/session/local_cluster.h"
#include "source_paths.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;

// Runs a short numpy program (needs Debian's python3-numpy, which
// python3-torch brings) with `dir` as its working directory.
void RunNumpy(const fs::path& dir, const std::string& program) {
  const fs::path script = dir / "make.py";
  std::ofstream(script) << "import numpy as np\n" << program << "\n";
  const std::string command = "cd " + dir.string() + " && /usr/bin/python3 " + script.string();
  ASSERT_EQ(std::system(command.c_str()), 0) << command << ": needs python3-numpy (scripts/bootstrap.sh installs it)";
}

TEST(NpyTest, FilesNumpyWroteReadBackExactly) {
  const fs::path dir = FreshTempDir("shoal_npy_", "numpy");
  RunNumpy(dir, R"(
np.save('f.npy', np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7)
np.save('u.npy', np.arange(10, dtype=np.uint8).reshape(5, 2))
np.save('l.npy', np.array([3, 1, 4, 1 << 40], dtype=np.int64))
np.save('scalar_rows.npy', np.zeros((3,), dtype=np.float32))
)");
  auto f = ReadNpy((dir / "f.npy").string());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->sizes(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_TRUE(f->equal(torch::arange(24, torch::kFloat32).reshape({2, 3, 4}) / 7));
  auto u = ReadNpy((dir / "u.npy").string());
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->scalar_type(), torch::kUInt8);
  EXPECT_EQ((*u)[4][1].item<int>(), 9);
  auto l = ReadNpy((dir / "l.npy").string());
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ((*l)[3].item<int64_t>(), int64_t{1} << 40);
  EXPECT_EQ(ReadNpy((dir / "scalar_rows.npy").string())->sizes(), (std::vector<int64_t>{3}));
  // What shoal writes, numpy reads.
  ASSERT_TRUE(WriteNpy((dir / "mine.npy").string(), torch::arange(6, torch::kInt64).reshape({3, 2})).ok());
  RunNumpy(dir, "a = np.load('mine.npy'); assert a.dtype == np.int64 and a.shape == (3, 2) and a[2, 1] == 5, a");
  fs::remove_all(dir);
}

TEST(NpyTest, ABadFileIsRefusedNamingItAndWhatIsWrong) {
  const fs::path dir = FreshTempDir("shoal_npy_", "bad");
  RunNumpy(dir, R"(
np.save('f64.npy', np.zeros((2, 2)))
np.save('fortran.npy', np.asfortranarray(np.zeros((3, 2), dtype=np.float32)))
np.save('good.npy', np.zeros((4, 4), dtype=np.float32))
open('truncated.npy', 'wb').write(open('good.npy', 'rb').read()[:-5])
open('longer.npy', 'wb').write(open('good.npy', 'rb').read() + b'xx')
open('garbage.npy', 'wb').write(b'not an npy file at all')
)");
  struct Case {
    const char* file;
    const char* expected;
  };
  for (const Case& c : {Case{"f64.npy", "dtype '<f8' is not one shoal reads"},
                        Case{"fortran.npy", "the array is in Fortran order"},
                        Case{"truncated.npy", "shape (4, 4) needs 64 bytes of data; the file has 59 (truncated)"},
                        Case{"longer.npy", "shape (4, 4) needs 64 bytes of data; the file has 66"},
                        Case{"garbage.npy", "not an NPY file (bad magic number)"}}) {
    const std::string path = (dir / c.file).string();
    auto read = ReadNpy(path);
    ASSERT_FALSE(read.ok()) << c.file;
    EXPECT_NE(read.status().message().find("NPY file '" + path + "': " + c.expected), std::string::npos)
        << read.status();
  }
  EXPECT_TRUE(absl::IsNotFound(ReadNpy((dir / "none.npy").string()).status()));
  fs::remove_all(dir);
}

TEST(NpyTest, FeaturesAndLabelsMustAgreeAndBeOfTheirDtypes) {
  const Normalization none;
  auto bad = MakeDataset(torch::zeros({3, 4}), torch::zeros({2}, torch::kInt64), none, 0, 1, "'x' and 'y'");
  EXPECT_NE(bad.status().message().find("'x' and 'y': 3 examples but 2 labels"), std::string::npos) << bad.status();
  bad = MakeDataset(torch::zeros({3, 4}), torch::zeros({3}, torch::kInt32), none, 0, 1, "'x' and 'y'");
  EXPECT_NE(bad.status().message().find("the labels must be int64 classes of shape [N] or float32 targets of shape "
                                        "[N, ...], are int32"),
            std::string::npos)
      << bad.status();
  bad = MakeDataset(torch::zeros({3, 4}), torch::full({3}, INFINITY), none, 0, 1, "'x' and 'y'");
  EXPECT_NE(bad.status().message().find("a target is NaN or infinite"), std::string::npos) << bad.status();
  bad = MakeDataset(torch::zeros({3, 4}, torch::kInt32), torch::zeros({3}, torch::kInt64), none, 0, 1, "'x'");
  EXPECT_NE(bad.status().message().find("the features are int32"), std::string::npos) << bad.status();
  bad = MakeDataset(torch::full({3, 4}, NAN), torch::zeros({3}, torch::kInt64), none, 0, 1, "'x'");
  EXPECT_NE(bad.status().message().find("a feature is NaN or infinite"), std::string::npos) << bad.status();
  // uint8 is scaled to [0, 1] by default, then standardised.
  Normalization standardise;
  standardise.mean = 0.5;
  standardise.std = 0.25;
  auto good = MakeDataset(torch::full({2, 3}, 255, torch::kUInt8), torch::zeros({2}, torch::kInt64), standardise, 0,
                          1, "'x'");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_FLOAT_EQ(good->images[1][2].item<float>(), 2.0f);
  auto config = ParseJobConfig("data: {format: npy, train_features: a.npy}");
  EXPECT_NE(config.status().message().find("data.format npy needs data.train_labels"), std::string::npos)
      << config.status();
  config = ParseJobConfig("data: {normalize: {std: 0}}");
  EXPECT_NE(config.status().message().find("data.normalize.std must be positive"), std::string::npos);
  config = ParseJobConfig("data: {format: csv}");
  EXPECT_NE(config.status().message().find("data.format 'csv' is unknown"), std::string::npos);
}

// Fashion-MNIST exported to NPY by the example script trains the CNN as the
// IDX files do; a label file that disagrees stops the job naming both files.
TEST(NpyTest, AJobTrainsOnNpyFilesTheExampleExported) {
  const fs::path dir = FreshTempDir("shoal_npy_", "job");
  const std::string command = std::string("/usr/bin/python3 ") + SHOAL_SOURCE_DIR +
                              "/examples/pytorch/export_npy.py --limit 8000 --out " + dir.string() + " > /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  auto config = LoadJobConfig(std::string(SHOAL_SOURCE_DIR) + "/examples/pytorch/npy.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  for (auto [path, name] : {std::pair{&config->data.train_features, "train_features.npy"},
                            std::pair{&config->data.train_labels, "train_labels.npy"},
                            std::pair{&config->data.test_features, "test_features.npy"},
                            std::pair{&config->data.test_labels, "test_labels.npy"}}) {
    *path = (dir / name).string();
  }
  config->model.cnn.conv = {{8}, {16}};
  config->model.cnn.dense = {32};
  config->data.test_examples = 1000;
  config->training.epochs = 2;
  auto report = TrainInProcess(*config, InProcOptions{}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_GT(report->test_accuracy, 0.7);

  config->data.test_labels = config->data.train_labels;  // 8,000 labels for the test split's 8,000 images: fine
  config->data.test_features = (dir / "short.npy").string();
  ASSERT_TRUE(WriteNpy(config->data.test_features, torch::zeros({10, 1, 28, 28}, torch::kUInt8)).ok());
  report = TrainInProcess(*config, InProcOptions{}, nullptr);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("'" + config->data.test_features + "' and '" + config->data.test_labels +
                                           "': 10 examples but 8000 labels"),
            std::string::npos)
      << report.status();
  fs::remove_all(dir);
}

// Regression: float32 targets and model.loss mse. A linear target is
// learned to a small fraction of its variance; class labels with mse (or
// targets with cross-entropy) are refused at start naming the loss.
TEST(NpyTest, MeanSquaredErrorLearnsARegressionFromNpyFiles) {
  const fs::path dir = FreshTempDir("shoal_npy_", "regression");
  torch::manual_seed(5);
  const torch::Tensor weights = torch::randn({8});
  for (const char* split : {"train", "test"}) {
    const torch::Tensor x = torch::randn({split == std::string("train") ? 8000 : 500, 8});
    ASSERT_TRUE(WriteNpy((dir / (std::string(split) + "_x.npy")).string(), x).ok());
    ASSERT_TRUE(WriteNpy((dir / (std::string(split) + "_y.npy")).string(), torch::mv(x, weights) + 0.5).ok());
  }
  JobConfig config = QuickJob("async");
  config.data.format = "npy";
  config.data.train_features = (dir / "train_x.npy").string();
  config.data.train_labels = (dir / "train_y.npy").string();
  config.data.test_features = (dir / "test_x.npy").string();
  config.data.test_labels = (dir / "test_y.npy").string();
  config.model.layers = {8, 32, 1};
  config.model.loss = "mse";
  config.training.epochs = 4;
  config.training.optimizer.set_learning_rate(0.01);
  ASSERT_TRUE(ValidateJobConfig(config).ok()) << ValidateJobConfig(config);
  auto report = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  const double variance = weights.pow(2).sum().item<double>();  // of the target, x ~ N(0, I)
  EXPECT_LT(report->test_loss, 0.01 * variance) << "variance " << variance;  // measured: 0.0004 of it

  config.model.loss = "cross_entropy";
  config.model.layers = {8, 32, 10};
  report = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("model.loss cross_entropy needs int64 class labels; the data's labels "
                                           "are float32"),
            std::string::npos)
      << report.status();
  config.model.loss = "huber";
  EXPECT_NE(ValidateJobConfig(config).message().find("model.loss 'huber' is unknown"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shoal
