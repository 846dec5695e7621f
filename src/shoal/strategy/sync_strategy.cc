#include "shoal/strategy/sync_strategy.h"

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

// The barrier: waits until global_step passes `local_step`, or the job is
// aborted, or `timeout` runs out. Returns the new global step.
absl::StatusOr<int64_t> WaitForNextStep(Client& client, const WorkerContext& context, int64_t local_step,
                                        absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    SHOAL_ASSIGN_OR_RETURN(int64_t step, client.PollCounter(kGlobalStep, local_step + 1, absl::Milliseconds(100)));
    if (step > local_step) return step;
    SHOAL_ASSIGN_OR_RETURN(int64_t aborted, client.AddToCounter(kJobAborted, 0));
    if (aborted > 0) {
      return absl::AbortedError(absl::StrCat(context.task.ToString(), ": the chief ended the job at step ",
                                             local_step + 1, " (a synchronous step could not complete)"));
    }
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat(context.task.ToString(), " waited ", absl::FormatDuration(timeout), " for step ",
                       local_step + 1, "; the chief ", context.workers.empty() ? "" : context.workers[0].ToString(),
                       " did not complete it"));
    }
  }
}

}  // namespace

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
  std::vector<std::string> worker_names;
  for (const TaskId& w : context.workers) worker_names.push_back(w.ToString());
  const std::string me = context.task.ToString();
  const absl::Duration timeout = absl::Seconds(config.training.sync_timeout_s);
  BatchIterator batches(context.train_shard, config.training.batch_size,
                        config.training.seed * 1000003 + context.worker_index);

  WorkerResult result;
  SHOAL_ASSIGN_OR_RETURN(int64_t local_step, client.AddToCounter(kGlobalStep, 0));
  while (local_step < context.max_steps) {
    SHOAL_ASSIGN_OR_RETURN(double loss, PullAndComputeGradients(client, model, batches));
    SHOAL_ASSIGN_OR_RETURN(int dropped, client.Accumulate(names, model.Gradients(), local_step, me));
    if (dropped > 0) SHOAL_RETURN_IF_ERROR(client.AddToCounter(kStaleGradients, 1).status());
    int64_t step = 0;
    if (context.is_chief) {
      absl::Status applied = client.ApplyAccumulated(names, replicas, local_step + 1, timeout, worker_names);
      if (!applied.ok()) {
        client.AddToCounter(kJobAborted, 1).IgnoreError();  // release the others
        return applied;
      }
      // The chief advances global_step itself, so it need not wait for it.
      SHOAL_ASSIGN_OR_RETURN(step, client.AddToCounter(kGlobalStep, 1));
    } else {
      SHOAL_ASSIGN_OR_RETURN(step, WaitForNextStep(client, context, local_step, timeout));
    }
    ++result.local_steps;
    result.last_loss = loss;
    if (context.on_step) context.on_step(step, result.last_loss);
    local_step = step;
  }
  return result;
}

}  // namespace shoal
