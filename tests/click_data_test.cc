// Click logs: the Criteo reader (values, missing features, ids, and bad
// lines named by file and line) and AUC / log loss against known values.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>

#include "shoal/data/criteo.h"
#include "shoal/model/click_metrics.h"
#include "shoal/model/click_model.h"
#include "temp_dir.h"

namespace shoal {
namespace {

std::string Line(const std::string& label, const std::string& first_integer, const std::string& first_hash) {
  std::string line = label + "\t" + first_integer;
  for (int i = 1; i < 13; ++i) line += "\t" + std::to_string(i);
  line += "\t" + first_hash;
  for (int i = 1; i < 26; ++i) line += "\t" + std::string(i % 2 ? "" : "a0b1c2d3");
  return line;
}

std::string WriteLog(const std::string& name, const std::vector<std::string>& lines) {
  const auto dir = FreshTempDir("shoal_criteo_", name);
  const std::string path = (dir / "day_0.tsv").string();
  std::ofstream out(path);
  for (const auto& l : lines) out << l << "\n";
  return path;
}

TEST(CriteoTest, ReadsLabelsIntegersAndHashesIntoIdsPerFeature) {
  const std::string path = WriteLog("good", {Line("1", "0", "68fd1e64"), Line("0", "", ""), Line("0", "-3", "ffffffff")});
  auto log = ReadCriteo(path).value();
  ASSERT_EQ(log.size(), 3);
  EXPECT_TRUE(log.labels.equal(torch::tensor({1.0f, 0.0f, 0.0f})));
  EXPECT_EQ(log.integers[0][0].item<int64_t>(), 0);
  EXPECT_EQ(log.integers[0][1].item<int64_t>(), 1);                      // integer feature 2 = 1
  EXPECT_EQ(log.integers[1][0].item<int64_t>(), 0);                      // missing
  EXPECT_EQ(log.integers[2][0].item<int64_t>(), -3);                     // as it is
  const torch::Tensor dense = ClickDenseFeatures(log.integers);          // what the click model sees
  EXPECT_FLOAT_EQ(dense[0][1].item<float>(), std::log1p(1.0f));
  EXPECT_FLOAT_EQ(dense[2][0].item<float>(), 0.0f);                      // negative: clipped at 0
  EXPECT_EQ(log.categorical[0][0].item<int64_t>(), 0x68fd1e64);          // feature 0
  EXPECT_EQ(log.categorical[1][0].item<int64_t>(), 0);                   // missing
  EXPECT_EQ(log.categorical[0][2].item<int64_t>(), (int64_t{2} << 32) | 0xa0b1c2d3);  // feature 2
  EXPECT_EQ(log.categorical[0][1].item<int64_t>(), int64_t{1} << 32);    // feature 1, missing
  auto folded = ReadCriteo(path, CriteoOptions{2, 1000}).value();
  ASSERT_EQ(folded.size(), 2);  // max_examples
  EXPECT_GE(folded.categorical.min().item<int64_t>(), 0);
  EXPECT_LT(folded.categorical.max().item<int64_t>(), 1000);
}

TEST(CriteoTest, ABadLineIsAnErrorNamingTheFileAndLine) {
  struct Case {
    std::string line, expected;
  };
  const std::vector<Case> cases = {
      {"1\t2\t3", "3 tab-separated fields, expected 40"},
      {Line("2", "0", "68fd1e64"), "the label is '2'"},
      {Line("1", "x7", "68fd1e64"), "integer feature 1 is 'x7'"},
      {Line("1", "0", "zz"), "categorical feature 1 is 'zz'"},
      {Line("1", "0", "123456789"), "not a 32-bit hex hash"},
  };
  for (const Case& c : cases) {
    const std::string path = WriteLog("bad", {Line("0", "1", "ab"), c.line});
    auto log = ReadCriteo(path);
    ASSERT_FALSE(log.ok()) << c.expected;
    EXPECT_NE(log.status().message().find(path + ":2: "), std::string::npos) << log.status();
    EXPECT_NE(log.status().message().find(c.expected), std::string::npos) << log.status();
  }
  EXPECT_TRUE(absl::IsNotFound(ReadCriteo("/nonexistent/day_0").status()));
}

TEST(ClickMetricsTest, AucAndLogLossMatchKnownValues) {
  // scikit-learn: roc_auc_score([0,0,1,1], [.1,.4,.35,.8]) = 0.75.
  auto m = ComputeClickMetrics(torch::tensor({0.1f, 0.4f, 0.35f, 0.8f}), torch::tensor({0.0f, 0.0f, 1.0f, 1.0f}));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_NEAR(m->auc, 0.75, 1e-9);
  EXPECT_NEAR(m->log_loss, -(std::log(0.9) + std::log(0.6) + std::log(0.35) + std::log(0.8)) / 4, 1e-6);
  // Ties count half; a perfect ranking is 1.
  EXPECT_NEAR(ComputeClickMetrics(torch::tensor({0.5f, 0.5f}), torch::tensor({0.0f, 1.0f}))->auc, 0.5, 1e-9);
  EXPECT_NEAR(ComputeClickMetrics(torch::tensor({0.2f, 0.9f}), torch::tensor({0.0f, 1.0f}))->auc, 1.0, 1e-9);
  EXPECT_FALSE(ComputeClickMetrics(torch::tensor({0.2f, 0.9f}), torch::tensor({1.0f, 1.0f})).ok());
}

}  // namespace
}  // namespace shoal
