// A hook that keeps every step a worker finishes, for tests that look at
// what each step drew (StepInfo::examples) or reached.
#ifndef SHOAL_TESTS_STEP_RECORDER_H_
#define SHOAL_TESTS_STEP_RECORDER_H_

#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
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

}  // namespace shoal

#endif  // SHOAL_TESTS_STEP_RECORDER_H_
