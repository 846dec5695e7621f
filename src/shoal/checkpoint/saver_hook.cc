#include "shoal/checkpoint/saver_hook.h"

#include "absl/strings/str_format.h"
#include "shoal/core/status.h"

namespace shoal {

CheckpointSaverHook::CheckpointSaverHook(Client* client, CheckpointConfig config, std::vector<std::string> counters)
    : client_(client), config_(std::move(config)), counters_(std::move(counters)), last_time_(absl::Now()) {
  if (config_.every_steps <= 0 && config_.every_seconds <= 0) config_.every_seconds = 60;
}

absl::Status CheckpointSaverHook::AfterStep(const StepInfo& step, StopRequest* stop) {
  if (last_step_ < 0) last_step_ = step.global_step - 1;  // the step the job started (or resumed) at
  const bool steps_due = config_.every_steps > 0 && step.global_step - last_step_ >= config_.every_steps;
  const bool time_due = config_.every_seconds > 0 && absl::Now() - last_time_ >= absl::Seconds(config_.every_seconds);
  if (!steps_due && !time_due) return absl::OkStatus();
  const absl::Time start = absl::Now();
  auto saved = SaveAndPrune(*client_, config_, step.global_step, counters_);
  seconds_saving_ += absl::ToDoubleSeconds(absl::Now() - start);
  if (saved.ok()) {
    ++saved_;
  } else {
    // A task is down (it may come back and be restored): this save is lost,
    // training is not. The unfinished folder never counts as a checkpoint.
    if (!absl::IsUnavailable(saved.status()) && !absl::IsFailedPrecondition(saved.status())) return saved.status();
    absl::FPrintF(stderr, "checkpoint at global step %d not saved: %s\n", step.global_step, saved.status().message());
  }
  last_step_ = step.global_step;
  last_time_ = absl::Now();
  return absl::OkStatus();
}

absl::StatusOr<std::string> SaveAndPrune(Client& client, const CheckpointConfig& config, int64_t step,
                                         const std::vector<std::string>& counters) {
  SHOAL_ASSIGN_OR_RETURN(std::string path, SaveCheckpoint(client, config.dir, step, counters));
  SHOAL_RETURN_IF_ERROR(PruneCheckpoints(config.dir, config.keep));
  return path;
}

}  // namespace shoal
