#include "shoal/hooks/hook.h"

#include "shoal/core/status.h"
#include "shoal/telemetry/phase.h"

namespace shoal {

absl::Status HookList::BeforeUpdate(const std::vector<std::string>& names, const std::vector<torch::Tensor>& update,
                                    const StepInfo& step, StopRequest* stop) {
  for (auto& hook : hooks_) {
    SHOAL_RETURN_IF_ERROR(hook->BeforeUpdate(names, update, step, stop));
    if (stop->requested) break;
  }
  return absl::OkStatus();
}

absl::Status HookList::AfterStep(StepInfo& step, StopRequest* stop) {
  const absl::Time now = absl::Now();
  // The first step opens the window: its own duration is unknown.
  if (window_start_ == absl::InfinitePast()) {
    window_start_ = now;
  } else {
    window_examples_ += step.examples;
  }
  const double seconds = absl::ToDoubleSeconds(now - window_start_);
  if (seconds >= 2.0) {
    examples_per_second_ = window_examples_ / seconds;
    window_start_ = now;
    window_examples_ = 0;
  } else if (examples_per_second_ == 0 && seconds > 0) {
    examples_per_second_ = window_examples_ / seconds;  // until the first window closes
  }
  step.examples_per_second = examples_per_second_;
  last_ = step;
  last_.model = nullptr;  // may not outlive the step
  // The phases from here on are the next step's (the trace tags them so).
  if (PhaseRecorder* recorder = PhaseRecorder::Current(); recorder != nullptr) recorder->SetStep(step.local_step + 1);
  for (auto& hook : hooks_) SHOAL_RETURN_IF_ERROR(hook->AfterStep(step, stop));
  return absl::OkStatus();
}

void HookList::End(const absl::Status& status) {
  for (auto& hook : hooks_) hook->End(last_, status);
}

}  // namespace shoal
