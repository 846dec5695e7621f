#include "shoal/strategy/step_driver.h"

#include "shoal/core/status.h"

namespace shoal {

absl::StatusOr<WorkerResult> DriveSteps(WorkerContext& context, StepPolicy& policy) {
  const StrategyConfig& config = *context.config;
  SHOAL_RETURN_IF_ERROR(policy.Start(context));
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> built, MakeModel(config.model));
  Model& model = *built;
  SHOAL_RETURN_IF_ERROR(InitializeOrWait(context, model));
  context.chief_publishes_buffers = true;
  const std::vector<std::string>& names = model.variable_names();
  BatchIterator batches(context.train_shard, config.training.batch_size,
                        config.training.seed * 1000003 + context.worker_index);
  WorkerResult result;
  SHOAL_RETURN_IF_ERROR(policy.Join(model));
  auto step_once = [&]() -> absl::StatusOr<bool> {
    if (!policy.HasStepsLeft()) return false;
    if (context.before_step) context.before_step(policy.LocalStep());
    SHOAL_ASSIGN_OR_RETURN(bool may_step, policy.Barrier());
    if (!may_step) return false;
    SHOAL_RETURN_IF_ERROR(policy.Pull(model));
    const BatchResult batch = ComputeGradients(model, batches);
    StepInfo step = MakeStepInfo(result.local_steps + 1, policy.GlobalStep(), batch, model);
    const std::vector<torch::Tensor> gradients = model.Gradients();
    SHOAL_ASSIGN_OR_RETURN(bool send, CheckUpdate(context, names, gradients, step, &result));
    if (!send) return false;
    SHOAL_ASSIGN_OR_RETURN(PushOutcome outcome, policy.Push(model, gradients, step));
    if (outcome == PushOutcome::kStopped) return false;
    if (outcome == PushOutcome::kRewound) {
      SHOAL_RETURN_IF_ERROR(policy.Join(model));
      return true;
    }
    SHOAL_ASSIGN_OR_RETURN(bool go_on, FinishStep(context, step, &result));
    return go_on && outcome == PushOutcome::kStepDone;
  };
  // A lost ps: the chief restores the newest checkpoint and every worker
  // rejoins the job where it now is.
  SHOAL_RETURN_IF_ERROR(StepUntilDone(context, names, model.variables(), config.training.optimizer, step_once,
                                      [&] { return policy.Join(model); }));
  return result;
}

}  // namespace shoal
