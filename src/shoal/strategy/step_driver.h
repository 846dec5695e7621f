// The step loop the data-parallel modes share (async, sync, ssp): build the
// model, create or wait for its variables, then per step pull, compute,
// check, push and finish, recovering from a lost ps through the newest
// checkpoint. A mode gives only its policies: where it joins the job, its
// barrier before a step, how it pulls and how it pushes.
//
// One driver per worker thread.
#ifndef SHOAL_STRATEGY_STEP_DRIVER_H_
#define SHOAL_STRATEGY_STEP_DRIVER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "shoal/strategy/strategy.h"

namespace shoal {

// What a push made of the step.
enum class PushOutcome {
  kStepDone,  // the step counts; train on
  kLastStep,  // the step counts; training is over (the last step, or a stop)
  kRewound,   // a restore undid the step: rejoin (StepPolicy::Join) and train on
  kStopped,   // the job was stopped before the step completed
};

class StepPolicy {
 public:
  virtual ~StepPolicy() = default;
  // Before the model is built (sync sets its accumulator rule here).
  virtual absl::Status Start(WorkerContext& /*context*/) { return absl::OkStatus(); }
  // Before the first step and after a restore: where this worker is in the
  // job (and, for a mode that pulls at its barrier, the model's values).
  virtual absl::Status Join(Model& /*model*/) { return absl::OkStatus(); }
  // Whether this worker has a step left to take.
  virtual bool HasStepsLeft() const = 0;
  // This worker's own step count, for WorkerContext::before_step.
  virtual int64_t LocalStep() const = 0;
  // Waits until this worker may take its step (ssp's staleness bound);
  // false: the job was stopped.
  virtual absl::StatusOr<bool> Barrier() { return true; }
  // Puts the values the step trains from into `model`.
  virtual absl::Status Pull(Model& model) = 0;
  // The global step the hooks see before the push.
  virtual int64_t GlobalStep() const = 0;
  // Sends the step's gradients; sets step.global_step to the step it made.
  virtual absl::StatusOr<PushOutcome> Push(Model& model, const std::vector<torch::Tensor>& gradients,
                                           StepInfo& step) = 0;
};

// Runs one worker with `policy`, the model of context.config->model; the
// chief publishes the model's buffers (PublishChiefBuffers).
absl::StatusOr<WorkerResult> DriveSteps(WorkerContext& context, StepPolicy& policy);

}  // namespace shoal

#endif  // SHOAL_STRATEGY_STEP_DRIVER_H_
