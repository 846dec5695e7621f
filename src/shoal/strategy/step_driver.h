// The step loop that every mode training one model per worker shares
// (async, sync, ssp, downpour, model_average, easgd): build the model,
// create or wait for its variables, then per step pull, compute, push
// (through the hooks) and finish, recovering from a lost ps through the
// newest checkpoint. A mode gives only its policies: what it trains, where
// it joins the job, its barrier before a step, how it pulls and how it
// pushes. (A population's members and the gated lockstep exchange more than
// one model's values per step, and keep loops of their own.)
//
// One driver per worker thread.
#ifndef SHOAL_STRATEGY_STEP_DRIVER_H_
#define SHOAL_STRATEGY_STEP_DRIVER_H_

#include <functional>
#include <memory>
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

// Runs the hooks on an update before it is sent (CheckUpdate for the step):
// false when a hook stopped training, and then nothing may be sent.
using UpdateCheck =
    std::function<absl::StatusOr<bool>(const std::vector<std::string>& names, const std::vector<torch::Tensor>& update)>;

class StepPolicy {
 public:
  virtual ~StepPolicy() = default;
  // Builds what the worker trains, before its variables are created (sync
  // and model_average set their accumulator rules here). By default the
  // model of context.config->model.
  virtual absl::StatusOr<Model*> Start(WorkerContext& context);
  // The optimizer the ps's variables are created with (default:
  // training.optimizer).
  virtual wire::OptimizerConfig PsOptimizer(const WorkerContext& context) const;
  // Whether the chief publishes its buffers (PublishChiefBuffers): the rule
  // of async, sync and ssp; the local-replica modes push their drift.
  virtual bool ChiefPublishesBuffers() const { return true; }
  // Whether every step's push sends an update (its batch's places with it);
  // otherwise only a step that ends with an exchange (StepInfo::exchanged)
  // does, carrying the places of the local steps since the last.
  virtual bool SendsEveryStep() const { return true; }
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
  // Sends what the step makes of its gradients, after `check` passed it (a
  // hook that stops training: kStopped, nothing sent); sets
  // step.global_step (and step.local_step where the mode counts its own).
  virtual absl::StatusOr<PushOutcome> Push(Model& model, const std::vector<torch::Tensor>& gradients,
                                           StepInfo& step, const UpdateCheck& check) = 0;
  // Once training has ended without an error, whatever the reason: what
  // the policy still owes the ps (sync's chief: the last steps' global_step).
  virtual absl::Status Finish() { return absl::OkStatus(); }

 protected:
  std::unique_ptr<Model> model_;  // what Start built by default
};

// Runs one worker with `policy`.
absl::StatusOr<WorkerResult> DriveSteps(WorkerContext& context, StepPolicy& policy);

}  // namespace shoal

#endif  // SHOAL_STRATEGY_STEP_DRIVER_H_
