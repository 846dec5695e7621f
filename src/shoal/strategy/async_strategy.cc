#include "shoal/strategy/async_strategy.h"

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"

namespace shoal {

absl::StatusOr<WorkerResult> AsyncStrategy::RunWorker(WorkerContext& context) {
  const JobConfig& config = *context.config;
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> built, MakeModel(config.model));
  Model& model = *built;
  SHOAL_RETURN_IF_ERROR(InitializeOrWait(context, model));
  const std::vector<std::string>& names = model.variable_names();
  BatchIterator batches(context.train_shard, config.training.batch_size,
                        config.training.seed * 1000003 + context.worker_index);
  WorkerResult result;
  int64_t global_step = 0;
  // One step; false when training is over.
  auto step_once = [&]() -> absl::StatusOr<bool> {
    SHOAL_ASSIGN_OR_RETURN(BatchResult batch, PullAndComputeGradients(*context.client, model, batches));
    StepInfo step = MakeStepInfo(result.local_steps + 1, global_step, batch, model);
    const std::vector<torch::Tensor> gradients = model.Gradients();
    SHOAL_ASSIGN_OR_RETURN(bool send, CheckUpdate(context, names, gradients, step, &result));
    if (!send) return false;
    SHOAL_ASSIGN_OR_RETURN(std::vector<int64_t> counters,
                           context.client->ApplyGradients(names, gradients, {{kGlobalStep, 1}, {kStopRequested, 0}}));
    step.global_step = global_step = counters[0];
    SHOAL_ASSIGN_OR_RETURN(bool go_on, FinishStep(context, step, &result));
    return go_on && counters[1] == 0 && global_step < context.max_steps;
  };
  SHOAL_RETURN_IF_ERROR(
      StepUntilDone(context, names, model.variables(), config.training.optimizer, step_once, /*rejoin=*/nullptr));
  return result;
}

}  // namespace shoal
