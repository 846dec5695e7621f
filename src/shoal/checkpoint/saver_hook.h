// CheckpointSaverHook: the chief's hook that saves a checkpoint every N
// global steps or seconds and keeps the newest k (config `checkpoint:`).
// The final checkpoint is the session's: it is taken once every worker is
// done (session/worker_session.cc).
//
// In the background (checkpoint.background), a save runs on a thread of the
// hook's while the chief trains on: the ps tasks write their shards and the
// chief only waits for the answers. One save at a time: one due while
// another is written starts at the first step after it ends. End() waits for
// the one in flight.
#ifndef SHOAL_CHECKPOINT_SAVER_HOOK_H_
#define SHOAL_CHECKPOINT_SAVER_HOOK_H_

#include <future>
#include <optional>
#include <memory>

#include "absl/time/clock.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/hooks/hook.h"

namespace shoal {

class CheckpointSaverHook : public TrainingHook {
 public:
  // `client` must outlive the hook; `counters` are saved with each checkpoint.
  CheckpointSaverHook(Client* client, CheckpointConfig config, std::vector<std::string> counters = {},
                      bool background = false);

  // A background save's error that is not a lost task's (a full disk) fails
  // the chief here, at the first step after it.
  absl::Status AfterStep(const StepInfo& step, StopRequest* stop) override;
  void End(const StepInfo& last, const absl::Status& status) override;

  // Checkpoints saved so far; the seconds the chief's training waited for
  // saves (all of each, unless in the background); the seconds the saves
  // took, wherever they ran.
  int64_t saved() const { return saved_; }
  double seconds_waited() const { return seconds_waited_; }
  double seconds_saving() const { return seconds_saving_; }
  bool background() const { return background_; }

 private:
  struct Outcome {
    absl::StatusOr<std::string> saved;
    absl::Duration took;
  };
  struct InFlight {
    int64_t step = 0;
    std::future<Outcome> outcome;  // std::async's: destroying it waits for the save
  };
  // Collects the save in flight once it has ended (with `wait`, waits for
  // it): its outcome, as Account says.
  absl::Status Collect(bool wait);
  // Counts a save that ended: a lost task's error (UNAVAILABLE, or a task
  // that does not hold what it should), a deadline or a busy server loses
  // that save, not training; any other (a full disk) is returned.
  absl::Status Account(int64_t step, absl::Duration took, const absl::StatusOr<std::string>& saved);

  Client* client_;
  CheckpointConfig config_;
  std::vector<std::string> counters_;
  const bool background_;
  int64_t last_step_ = -1;
  absl::Time last_time_;
  int64_t saved_ = 0;
  double seconds_waited_ = 0;
  double seconds_saving_ = 0;
  std::optional<InFlight> in_flight_;
};

// Saves a checkpoint at `step` under config.dir and prunes to config.keep;
// returns its path.
absl::StatusOr<std::string> SaveAndPrune(Client& client, const CheckpointConfig& config, int64_t step,
                                         const std::vector<std::string>& counters = {});

}  // namespace shoal

#endif  // SHOAL_CHECKPOINT_SAVER_HOOK_H_
