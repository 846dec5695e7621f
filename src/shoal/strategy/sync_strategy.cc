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
  BatchIterator batches(context.train_shard, config.training.batch_size,
                        config.training.seed * 1000003 + context.worker_index);

  WorkerResult result;
  SHOAL_ASSIGN_OR_RETURN(int64_t local_step, client.AddToCounter(kGlobalStep, 0));
  int64_t global_step = local_step;  // the chief's last word to the counter
  SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> values, client.Read(names));
  model.Load(values);
  while (local_step < context.max_steps) {
    const BatchResult batch = ComputeGradients(model, batches);
    StepInfo info = MakeStepInfo(result.local_steps + 1, local_step, batch, model);
    const std::vector<torch::Tensor> gradients = model.Gradients();
    SHOAL_ASSIGN_OR_RETURN(bool send, CheckUpdate(context, names, gradients, info, &result));
    if (!send) break;
    // The gradient that completes a step's R makes its server apply the mean.
    SHOAL_ASSIGN_OR_RETURN(int dropped, client.Accumulate(names, gradients, local_step, me, replicas));
    if (dropped > 0) SHOAL_RETURN_IF_ERROR(client.AddToCounter(kStaleGradients, 1).status());
    // The barrier and the next step's pull in one call.
    SHOAL_ASSIGN_OR_RETURN(Client::StepValues next, ReadAtStepOrStop(context, names, local_step + 1, replicas));
    if (!next.ready) break;  // stopped
    model.Load(next.values);
    if (context.is_chief && next.step > global_step) {
      SHOAL_ASSIGN_OR_RETURN(global_step, client.AddToCounter(kGlobalStep, next.step - global_step));
    }
    info.global_step = next.step;
    SHOAL_ASSIGN_OR_RETURN(bool go_on, FinishStep(context, info, &result));
    if (!go_on) break;
    local_step = next.step;
  }
  return result;
}

}  // namespace shoal
