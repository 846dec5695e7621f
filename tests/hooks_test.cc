// Training hooks: the NaN guard, stopping, logging, metrics files and the
// plot drawn from them, in every mode that has a barrier or none.
#include "shoal/hooks/standard_hooks.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "quick_job.h"
#include "shoal/report/metrics_plot.h"
#include "shoal/server/variable_store.h"
#include "shoal/session/local_cluster.h"

namespace shoal {
namespace {

// Notes, when the worker ends, whether every global variable is finite.
class GlobalsFiniteAtEnd : public TrainingHook {
 public:
  GlobalsFiniteAtEnd(Client* client, std::vector<std::string> names) : client_(client), names_(std::move(names)) {}
  void End(const StepInfo&, const absl::Status&) override {
    auto values = client_->Read(names_);
    finite = values.ok();
    if (values.ok()) {
      for (const auto& v : *values) finite = finite && AllFinite(v);
    }
  }
  bool finite = false;

 private:
  Client* client_;
  std::vector<std::string> names_;
};

// A job whose ps steps are so large that the model overflows within a few steps.
JobConfig DivergingJob(const std::string& nan_guard) {
  JobConfig config = QuickJob("async");
  config.cluster.workers = 1;
  config.training.optimizer.Clear();
  config.training.optimizer.set_kind("sgd");
  config.training.optimizer.set_learning_rate(1e6);
  config.hooks.nan_guard = nan_guard;
  return config;
}

absl::StatusOr<TrainReport> TrainWatchingGlobals(const JobConfig& config, std::shared_ptr<GlobalsFiniteAtEnd>* watch) {
  return TrainInProcess(config, InProcOptions{}, nullptr, [&](WorkerContext& context) {
    *watch = std::make_shared<GlobalsFiniteAtEnd>(context.client, Mlp(config.model).variable_names());
    context.extra_hooks.push_back(*watch);
  });
}

TEST(NanGuardTest, FailNamesTheTaskAndStepAndSendsNothing) {
  std::shared_ptr<GlobalsFiniteAtEnd> watch;
  auto report = TrainWatchingGlobals(DivergingJob("fail"), &watch);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition) << report.status();
  EXPECT_NE(report.status().message().find("/job:worker/task:0"), std::string::npos) << report.status();
  EXPECT_NE(report.status().message().find("at local step "), std::string::npos) << report.status();
  EXPECT_NE(report.status().message().find("nothing was sent"), std::string::npos) << report.status();
  EXPECT_TRUE(watch->finite);
}

TEST(NanGuardTest, StopEndsTheJobCleanlyWithTheReason) {
  std::shared_ptr<GlobalsFiniteAtEnd> watch;
  auto report = TrainWatchingGlobals(DivergingJob("stop"), &watch);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_NE(report->stop_reason.find("is nan at local step "), std::string::npos) << report->stop_reason;
  EXPECT_GE(report->global_step, 1);
  EXPECT_LT(report->global_step, 20);
  EXPECT_TRUE(watch->finite);
}

TEST(NanGuardTest, OffLeavesItToTheServerWhichRefusesTheGradient) {
  std::shared_ptr<GlobalsFiniteAtEnd> watch;
  auto report = TrainWatchingGlobals(DivergingJob("off"), &watch);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument) << report.status();
  EXPECT_NE(report.status().message().find("NaN or Inf"), std::string::npos) << report.status();
  EXPECT_TRUE(watch->finite);
}

// Sleeps for a second after the worker's first step, as a loaded machine's
// scheduler may hold a thread while the others run on.
class LagsAfterItsFirstStep : public TrainingHook {
 public:
  absl::Status AfterStep(const StepInfo&, StopRequest*) override {
    if (!lagged_) absl::SleepFor(absl::Seconds(1));
    lagged_ = true;
    return absl::OkStatus();
  }

 private:
  bool lagged_ = false;
};

// The job stops at a step; every worker stops cleanly, with or without a
// barrier, long before any deadline, and near the step even while the chief
// lags (which it saw only at its own steps when only the chief checked:
// global step 193 of 40 on a loaded machine).
class StopAtStepTest : public ::testing::TestWithParam<const char*> {};

TEST_P(StopAtStepTest, EveryWorkerStopsCleanlyNearTheStep) {
  JobConfig config = QuickJob(GetParam());
  config.training.sync_timeout_s = 60;
  config.hooks.stop_at_step = 40;
  auto report = TrainInProcess(config, InProcOptions{}, nullptr, [](WorkerContext& context) {
    if (context.is_chief) context.extra_hooks.push_back(std::make_shared<LagsAfterItsFirstStep>());
  });
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_NE(report->stop_reason.find("stop_at_step 40"), std::string::npos) << report->stop_reason;
  EXPECT_GE(report->global_step, 40);
  // A step in flight on each worker, or in the local modes an exchange of
  // 8 steps on each.
  EXPECT_LE(report->global_step, 40 + 16);
  EXPECT_LT(report->seconds, 30);
}

INSTANTIATE_TEST_SUITE_P(Modes, StopAtStepTest, ::testing::Values("async", "sync", "ssp", "model_average", "easgd"));

TEST(LoggingHookTest, WritesTheWindowMeanEveryNSteps) {
  std::FILE* out = std::tmpfile();
  LoggingHook hook("/job:worker/task:1", 2, out);
  StopRequest stop;
  for (int step = 1; step <= 4; ++step) {
    StepInfo info;
    info.local_step = step;
    info.loss = step;
    ASSERT_TRUE(hook.AfterStep(info, &stop).ok());
  }
  std::rewind(out);
  char buffer[512] = {};
  std::fread(buffer, 1, sizeof(buffer) - 1, out);
  std::fclose(out);
  const std::string text = buffer;
  EXPECT_NE(text.find("/job:worker/task:1 step 2 (global 0): loss 1.5000"), std::string::npos) << text;
  EXPECT_NE(text.find("step 4 (global 0): loss 3.5000"), std::string::npos) << text;
}

TEST(HookListTest, CountsExamplesPerSecond) {
  HookList hooks;
  StopRequest stop;
  StepInfo info;
  info.examples = 64;
  for (int i = 0; i < 3; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
    ASSERT_TRUE(hooks.AfterStep(info, &stop).ok());
  }
  EXPECT_GT(info.examples_per_second, 0);
  EXPECT_LT(info.examples_per_second, 64 * 2 / 0.009);  // two steps after the first, each 5 ms or more
}

class MetricsTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("shoal_metrics_" + std::string(GetParam()) + "_" +
                                                     std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_P(MetricsTest, EveryWorkerWritesItsCurvesAndPlotDrawsThem) {
  JobConfig config = QuickJob("async");
  config.training.epochs = 1;
  config.hooks.metrics_dir = dir_;
  config.hooks.metrics_format = GetParam();
  config.hooks.metrics_every_steps = 5;
  auto report = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  auto series = ReadMetricsDir(dir_);
  ASSERT_TRUE(series.ok()) << series.status();
  ASSERT_EQ(series->size(), 2u);
  for (const auto& s : *series) {
    EXPECT_GT(s.points.size(), 10u) << s.task;
    EXPECT_LT(s.points.back().loss, s.points.front().loss) << s.task;
    // Batch accuracy is noisy (and the last window may be one small batch):
    // judge the mean of the last third.
    double late = 0;
    const size_t third = s.points.size() / 3;
    for (size_t i = s.points.size() - third; i < s.points.size(); ++i) late += s.points[i].accuracy / third;
    EXPECT_GT(late, 0.6) << s.task;
    for (size_t i = 1; i < s.points.size(); ++i) EXPECT_GT(s.points[i].global_step, s.points[i - 1].global_step);
  }
  EXPECT_EQ((*series)[0].task, "/job:worker/task:0");
  const std::string png = (dir_ / "curves.png").string();
  ASSERT_TRUE(PlotMetrics(*series, png).ok());
  std::ifstream in(png, std::ios::binary);
  std::string head(8, '\0');
  in.read(head.data(), 8);
  EXPECT_EQ(head, "\x89PNG\r\n\x1a\n");
  EXPECT_GT(std::filesystem::file_size(png), 5000u);
}

INSTANTIATE_TEST_SUITE_P(Formats, MetricsTest, ::testing::Values("jsonl", "csv"));

TEST(MetricsFileTest, AGarbledRecordIsDataLossNamingFileAndLine) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("shoal_bad_metrics_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "worker_0.jsonl") << R"({"task":"w","time_s":1,"local_step":1,"global_step":1,"loss":2,"accuracy":0.5})"
                                        << "\n{\"task\": \"w\", \"loss\": \n";
  auto series = ReadMetricsDir(dir.string());
  EXPECT_EQ(series.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(series.status().message().find("worker_0.jsonl' line 2"), std::string::npos) << series.status();
  EXPECT_EQ(ReadMetricsDir((dir / "none").string()).status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shoal
