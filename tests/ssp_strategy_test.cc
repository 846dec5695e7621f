#include "shoal/strategy/ssp_strategy.h"

#include <gtest/gtest.h>

#include <numeric>

#include "shoal/session/local_cluster.h"
#include "quick_job.h"

namespace shoal {
namespace {

JobConfig QuickSspJob(int staleness) {
  JobConfig config = QuickJob("ssp");
  config.training.staleness = staleness;
  config.data.train_examples = 6000;
  return config;
}

// Worker 1 is slow, so the fast worker runs into the bound.
void SlowSecondWorker(WorkerContext& context) {
  if (context.worker_index == 1) context.before_step = [](int64_t) { absl::SleepFor(absl::Milliseconds(4)); };
}

int64_t Steps(const std::vector<int64_t>& histogram) {
  return std::accumulate(histogram.begin(), histogram.end(), int64_t{0});
}

TEST(SspTest, TheStalenessBoundIsNeverExceededAndIsReached) {
  auto report = TrainInProcess(QuickSspJob(2), InProcOptions{}, nullptr, SlowSecondWorker);
  ASSERT_TRUE(report.ok()) << report.status();
  const auto& gaps = report->ssp_gap_histogram;
  EXPECT_LE(gaps.size(), 3u) << "a step began more than 2 steps ahead of the slowest worker";
  ASSERT_EQ(gaps.size(), 3u) << "the fast worker never reached the bound";
  EXPECT_EQ(Steps(gaps), report->global_step);
  EXPECT_GT(report->test_accuracy, 0.7);
}

TEST(SspTest, StalenessZeroIsBulkSynchronous) {
  auto report = TrainInProcess(QuickSspJob(0), InProcOptions{}, nullptr, SlowSecondWorker);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->ssp_gap_histogram, std::vector<int64_t>{report->global_step});
}

TEST(SspTest, NegativeStalenessNeverWaits) {
  auto report = TrainInProcess(QuickSspJob(-1), InProcOptions{}, nullptr, SlowSecondWorker);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_GT(report->ssp_gap_histogram.size(), 3u) << "unbounded staleness should let the fast worker run ahead";
}

}  // namespace
}  // namespace shoal
