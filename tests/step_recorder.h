// Hooks that keep what each step of a worker did, for tests that look at
// what each step drew (StepInfo::examples), reached, or sent.
#ifndef SHOAL_TESTS_STEP_RECORDER_H_
#define SHOAL_TESTS_STEP_RECORDER_H_

#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "shoal/client/client.h"
#include "shoal/hooks/hook.h"
#include "shoal/session/local_cluster.h"

namespace shoal {

class StepRecorder : public TrainingHook {
 public:
  absl::Status AfterStep(const StepInfo& step, StopRequest* /*stop*/) override {
    absl::MutexLock lock(&mu_);
    steps_.push_back(step);
    return absl::OkStatus();
  }
  // The examples of each step, in order.
  std::vector<int64_t> BatchSizes() {
    absl::MutexLock lock(&mu_);
    std::vector<int64_t> sizes;
    for (const StepInfo& step : steps_) sizes.push_back(step.examples);
    return sizes;
  }

 private:
  absl::Mutex mu_;
  std::vector<StepInfo> steps_ ABSL_GUARDED_BY(mu_);
};

// Trains `config` in this process with a StepRecorder on every worker;
// `sizes` gets each worker's batch sizes, in order.
inline absl::StatusOr<TrainReport> TrainRecordingBatchSizes(const JobConfig& config,
                                                          std::vector<std::vector<int64_t>>* sizes) {
  std::vector<std::shared_ptr<StepRecorder>> recorders;
  for (int w = 0; w < config.cluster.workers; ++w) recorders.push_back(std::make_shared<StepRecorder>());
  auto report = TrainInProcess(config, InProcOptions{}, nullptr, [&](WorkerContext& context) {
    context.extra_hooks.push_back(recorders[context.worker_index]);
  });
  sizes->clear();
  for (auto& recorder : recorders) sizes->push_back(recorder->BatchSizes());
  return report;
}

// How many requests a worker's client has sent by the end of each step.
class RequestCounter : public TrainingHook {
 public:
  explicit RequestCounter(Client* client) : client_(client) {}
  absl::Status AfterStep(const StepInfo& /*step*/, StopRequest* /*stop*/) override {
    after_step.push_back(client_->requests_sent());
    return absl::OkStatus();
  }
  std::vector<int64_t> after_step;

 private:
  Client* client_;
};

// The requests the worker of one-worker job `config` had sent after each
// step; the job's report in `*report` if given.
inline std::vector<int64_t> RequestsAfterEachStep(const JobConfig& config, TrainReport* report_out = nullptr) {
  std::shared_ptr<RequestCounter> counter;
  auto report = TrainInProcess(config, InProcOptions{}, nullptr, [&](WorkerContext& context) {
    counter = std::make_shared<RequestCounter>(context.client);
    context.extra_hooks.push_back(counter);
  });
  EXPECT_TRUE(report.ok()) << report.status();
  if (report.ok() && report_out != nullptr) *report_out = *report;
  return report.ok() ? counter->after_step : std::vector<int64_t>();
}

}  // namespace shoal

#endif  // SHOAL_TESTS_STEP_RECORDER_H_
