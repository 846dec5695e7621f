#include "shoal/checkpoint/saver_hook.h"

#include "shoal/telemetry/phase.h"

#include "absl/strings/str_format.h"
#include "shoal/core/status.h"

namespace shoal {

CheckpointSaverHook::CheckpointSaverHook(Client* client, CheckpointConfig config, std::vector<std::string> counters,
                                         bool background)
    : client_(client),
      config_(std::move(config)),
      counters_(std::move(counters)),
      background_(background),
      last_time_(absl::Now()) {
  if (config_.every_steps <= 0 && config_.every_seconds <= 0) config_.every_seconds = 60;
}

absl::Status CheckpointSaverHook::AfterStep(const StepInfo& step, StopRequest* stop) {
  SHOAL_RETURN_IF_ERROR(Collect(/*wait=*/false));
  if (last_step_ < 0) last_step_ = step.global_step - 1;  // the step the job started (or resumed) at
  const bool steps_due = config_.every_steps > 0 && step.global_step - last_step_ >= config_.every_steps;
  const bool time_due = config_.every_seconds > 0 && absl::Now() - last_time_ >= absl::Seconds(config_.every_seconds);
  if (!steps_due && !time_due) return absl::OkStatus();
  if (in_flight_.has_value()) return absl::OkStatus();  // due again once the one being written is in
  last_step_ = step.global_step;
  last_time_ = absl::Now();
  if (!background_) {
    PhaseScope timed(Phase::kCheckpoint);
    const absl::Time start = absl::Now();
    auto saved = SaveAndPrune(*client_, config_, step.global_step, counters_);
    const absl::Duration took = absl::Now() - start;
    seconds_waited_ += absl::ToDoubleSeconds(took);
    return Account(step.global_step, took, saved);
  }
  const int64_t at = step.global_step;
  in_flight_ = InFlight{at, std::async(std::launch::async, [this, at] {
                          const absl::Time start = absl::Now();
                          absl::StatusOr<std::string> saved = SaveAndPrune(*client_, config_, at, counters_);
                          return Outcome{std::move(saved), absl::Now() - start};
                        })};
  return absl::OkStatus();
}

void CheckpointSaverHook::End(const StepInfo& last, const absl::Status& status) {
  const absl::Time start = absl::Now();
  const bool waited = in_flight_.has_value();
  absl::Status collected = Collect(/*wait=*/true);
  if (waited) seconds_waited_ += absl::ToDoubleSeconds(absl::Now() - start);
  if (!collected.ok()) absl::FPrintF(stderr, "checkpoint not saved: %s\n", collected.message());
}

absl::Status CheckpointSaverHook::Collect(bool wait) {
  if (!in_flight_.has_value()) return absl::OkStatus();
  if (!wait && in_flight_->outcome.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    return absl::OkStatus();
  }
  const int64_t step = in_flight_->step;
  const Outcome outcome = in_flight_->outcome.get();  // the save's RPCs have deadlines: bounded
  in_flight_.reset();
  return Account(step, outcome.took, outcome.saved);
}

absl::Status CheckpointSaverHook::Account(int64_t step, absl::Duration took, const absl::StatusOr<std::string>& saved) {
  seconds_saving_ += absl::ToDoubleSeconds(took);
  if (saved.ok()) {
    ++saved_;
    return absl::OkStatus();
  }
  // A task is down (it may come back and be restored), or too slow or busy
  // this time (checkpoint.timeout_s; a flood of waiting calls): this save
  // is lost, training is not. The unfinished folder never counts as a
  // checkpoint, and the session's final save still fails the job.
  const absl::Status& error = saved.status();
  if (!absl::IsUnavailable(error) && !absl::IsFailedPrecondition(error) && !absl::IsDeadlineExceeded(error) &&
      !absl::IsResourceExhausted(error)) {
    return error;
  }
  absl::FPrintF(stderr, "checkpoint at global step %d not saved: %s\n", step, saved.status().message());
  return absl::OkStatus();
}

absl::StatusOr<std::string> SaveAndPrune(Client& client, const CheckpointConfig& config, int64_t step,
                                         const std::vector<std::string>& counters) {
  SHOAL_ASSIGN_OR_RETURN(std::string path, SaveCheckpoint(client, config.dir, step, counters));
  SHOAL_RETURN_IF_ERROR(PruneCheckpoints(config.dir, config.keep));
  return path;
}

}  // namespace shoal
