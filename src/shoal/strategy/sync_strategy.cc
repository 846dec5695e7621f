#include "shoal/strategy/sync_strategy.h"

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"

namespace shoal {

absl::StatusOr<WorkerResult> SyncStrategy::RunWorker(WorkerContext& context) {
  const JobConfig& config = *context.config;
  const int replicas = ReplicasToAggregate(config, context.num_workers);
  if (replicas > context.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("replicas_to_aggregate (", replicas,
                                                   ") exceeds the number of workers (", context.num_workers,
                                                   "); one worker never contributes several gradients to a step"));
  }
  Client& client = *context.client;
  Mlp model(config.model);
  SHOAL_RETURN_IF_ERROR(InitializeOrWait(context, model));
  const std::vector<std::string>& names = model.variable_names();
  const std::string me = context.task.ToString();
  const absl::Duration timeout = absl::Seconds(config.training.sync_timeout_s);
  BatchIterator batches(context.train_shard, config.training.batch_size,
                        config.training.seed * 1000003 + context.worker_index);

  WorkerResult result;
  SHOAL_ASSIGN_OR_RETURN(int64_t local_step, client.AddToCounter(kGlobalStep, 0));
  while (local_step < context.max_steps) {
    SHOAL_ASSIGN_OR_RETURN(BatchResult batch, PullAndComputeGradients(client, model, batches));
    StepInfo info = MakeStepInfo(result.local_steps + 1, local_step, batch, model);
    const std::vector<torch::Tensor> gradients = model.Gradients();
    SHOAL_ASSIGN_OR_RETURN(bool send, CheckUpdate(context, names, gradients, info, &result));
    if (!send) break;
    SHOAL_ASSIGN_OR_RETURN(int dropped, client.Accumulate(names, gradients, local_step, me));
    if (dropped > 0) SHOAL_RETURN_IF_ERROR(client.AddToCounter(kStaleGradients, 1).status());
    int64_t step = 0;
    if (context.is_chief) {
      SHOAL_ASSIGN_OR_RETURN(bool applied,
                             ApplyAccumulatedOrStop(context, names, replicas, local_step + 1, wire::MEAN_GRADIENT));
      if (!applied) break;  // stopped
      // The chief advances global_step itself, so it need not wait for it.
      SHOAL_ASSIGN_OR_RETURN(step, client.AddToCounter(kGlobalStep, 1));
    } else {
      // The barrier: the next step begins once the chief has applied this one.
      SHOAL_ASSIGN_OR_RETURN(step, WaitForCounter(context, kGlobalStep, local_step + 1, timeout,
                                                  absl::StrCat("step ", local_step + 1)));
      if (step == 0) break;  // stopped
    }
    info.global_step = step;
    SHOAL_ASSIGN_OR_RETURN(bool go_on, FinishStep(context, info, &result));
    if (!go_on) break;
    local_step = step;
  }
  return result;
}

}  // namespace shoal
