#include "shoal/strategy/ssp_strategy.h"

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

std::string StepDoneCounter(int64_t step) { return absl::StrCat("ssp_done/", step); }
std::string ClockCounter(int worker) { return absl::StrCat("ssp_clock/", worker); }

// Waits until all `workers` have finished `step`, up to `timeout`.
absl::Status WaitForStepDone(Client& client, const WorkerContext& context, int64_t step, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    SHOAL_ASSIGN_OR_RETURN(int64_t done, client.PollCounter(StepDoneCounter(step), context.num_workers,
                                                            absl::Milliseconds(100)));
    if (done >= context.num_workers) return absl::OkStatus();
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(absl::StrCat(context.task.ToString(), " waited ",
                                                      absl::FormatDuration(timeout), " at the staleness bound: only ",
                                                      done, " of ", context.num_workers, " workers finished step ",
                                                      step));
    }
  }
}

}  // namespace

absl::StatusOr<WorkerResult> SspStrategy::RunWorker(WorkerContext& context) {
  const JobConfig& config = *context.config;
  const int64_t staleness = config.training.staleness;
  Client& client = *context.client;
  Mlp model(config.model);
  SHOAL_RETURN_IF_ERROR(InitializeOrWait(context, model));
  const std::vector<std::string>& names = model.variable_names();
  const absl::Duration timeout = absl::Seconds(config.training.sync_timeout_s);
  const int64_t local_steps = (context.max_steps + context.num_workers - 1) / context.num_workers;
  BatchIterator batches(context.train_shard, config.training.batch_size,
                        config.training.seed * 1000003 + context.worker_index);
  WorkerResult result;
  for (int64_t step = 0; step < local_steps; ++step) {
    if (context.before_step) context.before_step(step);
    if (staleness >= 0 && step > staleness) {
      SHOAL_RETURN_IF_ERROR(WaitForStepDone(client, context, step - staleness - 1, timeout));
    }
    // Measure the gap from the workers' own clocks, not from the wait above.
    int64_t slowest = step;
    for (int w = 0; w < context.num_workers; ++w) {
      SHOAL_ASSIGN_OR_RETURN(int64_t clock, client.AddToCounter(ClockCounter(w), 0));
      slowest = std::min(slowest, clock);
    }
    SHOAL_RETURN_IF_ERROR(client.AddToCounter(SspGapCounter(step - slowest), 1).status());

    SHOAL_ASSIGN_OR_RETURN(double loss, PullAndComputeGradients(client, model, batches));
    SHOAL_ASSIGN_OR_RETURN(std::vector<int64_t> counters,
                           client.ApplyGradients(names, model.Gradients(), {{kGlobalStep, 1}}));
    SHOAL_RETURN_IF_ERROR(client.AddToCounter(ClockCounter(context.worker_index), 1).status());
    SHOAL_RETURN_IF_ERROR(client.AddToCounter(StepDoneCounter(step), 1).status());
    ++result.local_steps;
    result.last_loss = loss;
    if (context.on_step) context.on_step(counters[0], result.last_loss);
  }
  return result;
}

}  // namespace shoal
