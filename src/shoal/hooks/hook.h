// Training hooks: code that runs around every worker's steps, whatever the
// training mode, in the spirit of TensorFlow's SessionRunHook. Strategies call
// HookList::BeforeUpdate before anything leaves the worker for the ps and
// HookList::AfterStep after each local step; the session builds the list from
// the config (hooks/standard_hooks.h).
//
// A hook stops training by filling a StopRequest. A stop asked on any worker
// stops the whole job: the strategy tells the other workers through the
// job's stop counter, and each ends cleanly at its next exchange with the ps.
#ifndef SHOAL_HOOKS_HOOK_H_
#define SHOAL_HOOKS_HOOK_H_

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "shoal/model/model.h"

namespace shoal {

// What one local step did.
struct StepInfo {
  int64_t local_step = 0;   // steps this worker has taken, this one included
  int64_t global_step = 0;  // the job's step, as this worker last saw it
  double loss = 0;
  double accuracy = 0;  // on this step's batch
  double auc = -1;      // clicks: the AUC of this step's batch (-1: not a click model, or one class only)
  int64_t examples = 0;  // in this step's batch
  double examples_per_second = 0;  // this worker's, over the last few seconds (HookList fills it in)
  bool exchanged = false;          // local modes: the step ended with an exchange with the ps
  // async: global steps others applied between this worker's read of the
  // values and its push (-1: the mode has none).
  double staleness = -1;
  double learning_rate = -1;  // the worker's (a population member's own); -1: unknown
  // What the mode has to say of the step beyond these, for TensorBoard
  // ("sync/stale_gradients_dropped", "population/fitness", "gated/weight_1").
  std::vector<std::pair<std::string, double>> scalars;
  const Model* model = nullptr;     // the worker's model after the step: its local replica, in local modes
};

struct StopRequest {
  bool requested = false;
  std::string reason;  // why, for the job's report

  void Request(std::string why) {
    if (requested) return;
    requested = true;
    reason = std::move(why);
  }
};

class TrainingHook {
 public:
  virtual ~TrainingHook() = default;
  // Before `update` (gradients, deltas or local values, one per name) leaves
  // the worker. An error fails the worker; a stop request ends training. In
  // both cases nothing is sent.
  virtual absl::Status BeforeUpdate(const std::vector<std::string>& names, const std::vector<torch::Tensor>& update,
                                    const StepInfo& step, StopRequest* stop) {
    return absl::OkStatus();
  }
  // After each local step; an error fails the worker.
  virtual absl::Status AfterStep(const StepInfo& step, StopRequest* stop) { return absl::OkStatus(); }
  // Once, when the worker's training ends: `last` is its last step (all zero
  // if it took none) and `status` how it ended.
  virtual void End(const StepInfo& last, const absl::Status& status) {}
};

// The hooks of one worker, run in order. Not thread-safe: one list per worker.
class HookList {
 public:
  void Add(std::shared_ptr<TrainingHook> hook) { hooks_.push_back(std::move(hook)); }
  bool empty() const { return hooks_.empty(); }

  absl::Status BeforeUpdate(const std::vector<std::string>& names, const std::vector<torch::Tensor>& update,
                            const StepInfo& step, StopRequest* stop);
  // Fills in step.examples_per_second (the step counter), then runs the hooks.
  absl::Status AfterStep(StepInfo& step, StopRequest* stop);
  void End(const absl::Status& status);

 private:
  std::vector<std::shared_ptr<TrainingHook>> hooks_;
  StepInfo last_;
  // The step counter: examples since window_start_, restarted every ~2 s.
  absl::Time window_start_ = absl::InfinitePast();
  int64_t window_examples_ = 0;
  double examples_per_second_ = 0;
};

}  // namespace shoal

#endif  // SHOAL_HOOKS_HOOK_H_
