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
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> built, MakeModel(config.model));
  Model& model = *built;
  // A restore puts the accumulators at the checkpoint's global step.
  context.restore_accumulator_step = [](int64_t global_step) -> absl::StatusOr<int64_t> { return global_step; };
  SHOAL_RETURN_IF_ERROR(InitializeOrWait(context, model));
  const std::vector<std::string>& names = model.variable_names();
  const std::string me = context.task.ToString();
  BatchIterator batches(context.train_shard, config.training.batch_size,
                        config.training.seed * 1000003 + context.worker_index);

  WorkerResult result;
  int64_t local_step = 0;
  int64_t global_step = 0;  // the chief's last word to the counter
  // Where the job is: at the start, and again after a restore put it back.
  auto join = [&]() -> absl::Status {
    SHOAL_ASSIGN_OR_RETURN(local_step, client.AddToCounter(kGlobalStep, 0));
    global_step = local_step;
    SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> values, client.Read(names));
    model.Load(values);
    return absl::OkStatus();
  };
  SHOAL_RETURN_IF_ERROR(join());
  // One step; false when training is over.
  auto step_once = [&]() -> absl::StatusOr<bool> {
    const BatchResult batch = ComputeGradients(model, batches);
    StepInfo info = MakeStepInfo(result.local_steps + 1, local_step, batch, model);
    const std::vector<torch::Tensor> gradients = model.Gradients();
    SHOAL_ASSIGN_OR_RETURN(bool send, CheckUpdate(context, names, gradients, info, &result));
    if (!send) return false;
    // The gradient that completes a step's R makes its server apply the mean.
    SHOAL_ASSIGN_OR_RETURN(int dropped, client.Accumulate(names, gradients, local_step, me, replicas));
    if (dropped > 0) SHOAL_RETURN_IF_ERROR(client.AddToCounter(kStaleGradients, 1).status());
    // The barrier and the next step's pull in one call.
    auto resend = [&] { return client.Accumulate(names, gradients, local_step, me, replicas).status(); };
    SHOAL_ASSIGN_OR_RETURN(StepWait next, ReadAtStepOrStop(context, names, local_step + 1, replicas, resend));
    if (next.rewound) {
      SHOAL_RETURN_IF_ERROR(join());
      return true;
    }
    if (!next.values.ready) return false;  // stopped
    model.Load(next.values.values);
    if (context.is_chief && next.values.step > global_step) {
      SHOAL_ASSIGN_OR_RETURN(global_step, client.AddToCounter(kGlobalStep, next.values.step - global_step));
    }
    info.global_step = next.values.step;
    SHOAL_ASSIGN_OR_RETURN(bool go_on, FinishStep(context, info, &result));
    local_step = next.values.step;
    return go_on;
  };
  // A lost ps: the chief restores the newest checkpoint, accumulators
  // included, and every worker goes on from its step.
  SHOAL_RETURN_IF_ERROR(StepUntilDone(
      context, names, model.variables(), config.training.optimizer,
      [&]() -> absl::StatusOr<bool> {
        if (local_step >= context.max_steps) return false;
        return step_once();
      },
      join));
  return result;
}

}  // namespace shoal
