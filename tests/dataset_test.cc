#include "shoal/data/dataset.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

namespace shoal {
namespace {

class DatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("shoal_dataset_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static std::string Header(std::vector<uint32_t> dims) {
    std::string h = {0, 0, 8, static_cast<char>(dims.size())};
    for (uint32_t d : dims) {
      for (int s = 24; s >= 0; s -= 8) h.push_back(static_cast<char>(d >> s));
    }
    return h;
  }
  void WriteGz(const std::string& name, const std::string& bytes) {
    gzFile f = gzopen((dir_ / name).c_str(), "wb");
    gzwrite(f, bytes.data(), bytes.size());
    gzclose(f);
  }
  // n 2x2 images with pixel value 10*i and label i % 10.
  void WriteSplit(const std::string& split, int n) {
    std::string images = Header({static_cast<uint32_t>(n), 2, 2}), labels = Header({static_cast<uint32_t>(n)});
    for (int i = 0; i < n; ++i) {
      images += std::string(4, static_cast<char>(10 * i));
      labels.push_back(static_cast<char>(i % 10));
    }
    WriteGz(split + "-images-idx3-ubyte.gz", images);
    WriteGz(split + "-labels-idx1-ubyte.gz", labels);
  }

  std::filesystem::path dir_;
};

TEST_F(DatasetTest, LoadsImagesAndLabels) {
  WriteSplit("train", 12);
  auto data = LoadMnistFormat(dir_, "train");
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size(), 12);
  EXPECT_EQ(data->images.sizes(), (std::vector<int64_t>{12, 1, 2, 2}));  // one channel, the file's rows and cols
  EXPECT_EQ(data->labels[11].item<int64_t>(), 1);
  // Pixels are scaled to [0, 1] then standardised; a brighter image is larger.
  EXPECT_GT(data->images[5][0][0][0].item<float>(), data->images[4][0][0][0].item<float>());
}

TEST_F(DatasetTest, ShardsCoverTheDataOnce) {
  WriteSplit("train", 10);
  Dataset data = LoadMnistFormat(dir_, "train").value();
  int64_t total = 0;
  for (int i = 0; i < 3; ++i) total += data.Shard(i, 3).size();
  EXPECT_EQ(total, 10);
  EXPECT_EQ(data.Shard(2, 3).labels[0].item<int64_t>(), 6);
}

TEST_F(DatasetTest, BatchesVisitEveryExampleEachEpoch) {
  WriteSplit("train", 10);
  BatchIterator batches(LoadMnistFormat(dir_, "train").value(), 4, 1);
  std::multiset<int64_t> seen;
  torch::Tensor x, y;
  for (int i = 0; i < 3; ++i) {
    batches.Next(&x, &y);
    for (int64_t j = 0; j < y.size(0); ++j) seen.insert(y[j].item<int64_t>());
  }
  EXPECT_EQ(seen.size(), 10u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 10u);
  batches.Next(&x, &y);
  EXPECT_EQ(batches.epoch(), 1);
}

// A restarted worker seeks to where it was: from there it draws what it
// would have drawn, whatever its batch size.
TEST_F(DatasetTest, AnIteratorSoughtToAPositionDrawsOnAsTheOneThatGotThere) {
  WriteSplit("train", 10);
  const Dataset data = LoadMnistFormat(dir_, "train").value();
  BatchIterator original(data, 4, 7);
  std::vector<int64_t> drawn;  // every label the original draws, in order
  std::vector<int64_t> positions;
  torch::Tensor x, y;
  for (int i = 0; i < 12; ++i) {  // 4 epochs of 3 batches
    positions.push_back(original.examples_drawn());
    original.Next(&x, &y);
    for (int64_t j = 0; j < y.size(0); ++j) drawn.push_back(y[j].item<int64_t>());
  }
  EXPECT_EQ(original.examples_drawn(), 40);
  // Every position, an epoch's end included, and one within a batch.
  positions.push_back(40);
  positions.push_back(13);
  for (int64_t at : positions) {
    for (int64_t batch : {4, 3}) {
      BatchIterator resumed(data, batch, 7);
      resumed.SeekTo(at);
      EXPECT_EQ(resumed.examples_drawn(), at);
      std::vector<int64_t> next;
      while (resumed.examples_drawn() < 40) {
        resumed.Next(&x, &y);
        for (int64_t j = 0; j < y.size(0); ++j) next.push_back(y[j].item<int64_t>());
      }
      EXPECT_EQ(next, std::vector<int64_t>(drawn.begin() + at, drawn.end())) << "at " << at << ", batch " << batch;
    }
  }
  // Batches count as the iterator draws them: 3 a 10-example epoch (4, 4, 2).
  EXPECT_EQ(original.ExamplesInBatches(0), 0);
  EXPECT_EQ(original.ExamplesInBatches(2), 8);
  EXPECT_EQ(original.ExamplesInBatches(3), 10);
  EXPECT_EQ(original.ExamplesInBatches(7), 24);
  EXPECT_EQ(original.ExamplesInBatches(INT64_MAX), INT64_MAX);  // saturates, never wraps below 0
  // A place a hundred trillion epochs in costs one shuffle, as any other.
  BatchIterator far(data, 4, 7);
  far.SeekTo(1'000'000'000'000'003);
  far.Next(&x, &y);
  EXPECT_EQ(y.size(0), 4);
  EXPECT_EQ(far.examples_drawn(), 1'000'000'000'000'007);
}

TEST_F(DatasetTest, MissingFileIsNotFoundNamingIt) {
  auto data = LoadMnistFormat(dir_, "train");
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(data.status().message().find("train-images-idx3-ubyte"), std::string::npos) << data.status();
}

TEST_F(DatasetTest, TruncatedFileIsDataLoss) {
  WriteGz("x.gz", Header({5, 2, 2}) + std::string(7, 'a'));
  auto data = ReadIdx(dir_ / "x.gz");
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(data.status().message().find("truncated"), std::string::npos) << data.status();
}

TEST_F(DatasetTest, BadMagicIsDataLoss) {
  WriteGz("x.gz", "garbage that is not an idx file");
  EXPECT_EQ(ReadIdx(dir_ / "x.gz").status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(DatasetTest, CorruptGzipIsDataLoss) {
  std::string bytes;
  {
    WriteSplit("train", 50);
    std::ifstream in(dir_ / "train-images-idx3-ubyte.gz", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (size_t i = bytes.size() / 2; i < bytes.size(); ++i) bytes[i] = static_cast<char>(~bytes[i]);
  std::ofstream(dir_ / "bad.gz", std::ios::binary) << bytes;
  EXPECT_EQ(ReadIdx(dir_ / "bad.gz").status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(DatasetTest, LabelCountMismatchIsDataLoss) {
  WriteGz("train-images-idx3-ubyte.gz", Header({3, 2, 2}) + std::string(12, 'a'));
  WriteGz("train-labels-idx1-ubyte.gz", Header({2}) + std::string(2, '\1'));
  auto data = LoadMnistFormat(dir_, "train");
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(data.status().message().find("2 labels for 3 images"), std::string::npos) << data.status();
}

TEST(FashionMnistTest, TheInstalledDatasetLoads) {
  auto train = LoadMnistFormat(kDefaultFashionMnistDir, "train");
  ASSERT_TRUE(train.ok()) << train.status() << " (install the Debian package dataset-fashion-mnist)";
  EXPECT_EQ(train->size(), 60000);
  EXPECT_EQ(train->images.sizes(), (std::vector<int64_t>{60000, 1, 28, 28}));
  auto test = LoadMnistFormat(kDefaultFashionMnistDir, "t10k");
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->size(), 10000);
}

}  // namespace
}  // namespace shoal
