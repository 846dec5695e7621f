// CheckpointSaverHook: the chief's hook that saves a checkpoint every N
// global steps or seconds and keeps the newest k (config `checkpoint:`).
// The final checkpoint is the session's: it is taken once every worker is
// done (session/worker_session.cc).
#ifndef SHOAL_CHECKPOINT_SAVER_HOOK_H_
#define SHOAL_CHECKPOINT_SAVER_HOOK_H_

#include "absl/time/clock.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/hooks/hook.h"

namespace shoal {

class CheckpointSaverHook : public TrainingHook {
 public:
  // `client` must outlive the hook; `counters` are saved with each checkpoint.
  CheckpointSaverHook(Client* client, CheckpointConfig config, std::vector<std::string> counters = {});

  absl::Status AfterStep(const StepInfo& step, StopRequest* stop) override;

  // Checkpoints saved so far, and the seconds the saves took (the chief's
  // training waits for each).
  int64_t saved() const { return saved_; }
  double seconds_saving() const { return seconds_saving_; }

 private:
  Client* client_;
  CheckpointConfig config_;
  std::vector<std::string> counters_;
  int64_t last_step_ = -1;
  absl::Time last_time_;
  int64_t saved_ = 0;
  double seconds_saving_ = 0;
};

// Saves a checkpoint at `step` under config.dir and prunes to config.keep;
// returns its path.
absl::StatusOr<std::string> SaveAndPrune(Client& client, const CheckpointConfig& config, int64_t step,
                                         const std::vector<std::string>& counters = {});

}  // namespace shoal

#endif  // SHOAL_CHECKPOINT_SAVER_HOOK_H_
