// A hook that keeps every step a worker finishes, for tests that look at
// what each step drew (StepInfo::examples) or reached.
#ifndef SHOAL_TESTS_STEP_RECORDER_H_
#define SHOAL_TESTS_STEP_RECORDER_H_

#include <vector>

#include "absl/synchronization/mutex.h"
#include "shoal/hooks/hook.h"

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

}  // namespace shoal

#endif  // SHOAL_TESTS_STEP_RECORDER_H_
