#include "shoal/strategy/ssp_strategy.h"

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

std::string StepDoneCounter(int64_t step) { return absl::StrCat("ssp_done/", step); }
std::string ClockCounter(int worker) { return absl::StrCat("ssp_clock/", worker); }

// Waits until all `workers` have finished `step`, up to `timeout`. Returns
// false if the job was stopped meanwhile.
absl::StatusOr<bool> WaitForStepDone(Client& client, const WorkerContext& context, int64_t step,
                                     absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    SHOAL_ASSIGN_OR_RETURN(int64_t done, client.PollCounter(StepDoneCounter(step), context.num_workers,
                                                            absl::Milliseconds(100)));
    if (done >= context.num_workers) return true;
    SHOAL_ASSIGN_OR_RETURN(bool stopped, JobStopRequested(client));
    if (stopped) return false;
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
      SHOAL_ASSIGN_OR_RETURN(bool go_on, WaitForStepDone(client, context, step - staleness - 1, timeout));
      if (!go_on) break;
    }
    // Measure the gap from the workers' own clocks, not from the wait above.
    int64_t slowest = step;
    for (int w = 0; w < context.num_workers; ++w) {
      SHOAL_ASSIGN_OR_RETURN(int64_t clock, client.AddToCounter(ClockCounter(w), 0));
      slowest = std::min(slowest, clock);
    }
    SHOAL_RETURN_IF_ERROR(client.AddToCounter(SspGapCounter(step - slowest), 1).status());

    SHOAL_ASSIGN_OR_RETURN(BatchResult batch, PullAndComputeGradients(client, model, batches));
    StepInfo info = MakeStepInfo(step + 1, 0, batch, model);
    const std::vector<torch::Tensor> gradients = model.Gradients();
    SHOAL_ASSIGN_OR_RETURN(bool send, CheckUpdate(context, names, gradients, info, &result));
    if (!send) break;
    SHOAL_ASSIGN_OR_RETURN(std::vector<int64_t> counters,
                           client.ApplyGradients(names, gradients, {{kGlobalStep, 1}, {kStopRequested, 0}}));
    SHOAL_RETURN_IF_ERROR(client.AddToCounter(ClockCounter(context.worker_index), 1).status());
    SHOAL_RETURN_IF_ERROR(client.AddToCounter(StepDoneCounter(step), 1).status());
    info.global_step = counters[0];
    SHOAL_ASSIGN_OR_RETURN(bool go_on, FinishStep(context, info, &result));
    if (!go_on || counters[1] > 0) break;
  }
  return result;
}

}  // namespace shoal
