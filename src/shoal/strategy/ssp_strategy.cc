#include "shoal/strategy/ssp_strategy.h"

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

// The clocks of one generation of the job (the restores so far): a restore
// starts them again, at the restored step, in fresh counters.
std::string StepDoneCounter(int64_t generation, int64_t step) {
  return absl::StrCat("ssp_done/", generation, "/", step);
}
std::string ClockCounter(int64_t generation, int worker) { return absl::StrCat("ssp_clock/", generation, "/", worker); }

// Waits until all `workers` have finished `step` of `generation`, up to
// `timeout`. Returns false if the job was stopped meanwhile; Unavailable if
// it was restored (JobRewound).
absl::StatusOr<bool> WaitForStepDone(WorkerContext& context, int64_t generation, int64_t step,
                                     absl::Duration timeout) {
  Client& client = *context.client;
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    SHOAL_ASSIGN_OR_RETURN(int64_t done, client.PollCounter(StepDoneCounter(generation, step), context.num_workers,
                                                            absl::Milliseconds(100)));
    if (done >= context.num_workers) return true;
    SHOAL_ASSIGN_OR_RETURN(bool stopped, JobStopRequested(client));
    if (stopped) return false;
    SHOAL_RETURN_IF_ERROR(JobRewound(context));
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
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> built, MakeModel(config.model));
  Model& model = *built;
  SHOAL_RETURN_IF_ERROR(InitializeOrWait(context, model));
  const std::vector<std::string>& names = model.variable_names();
  const absl::Duration timeout = absl::Seconds(config.training.sync_timeout_s);
  const int64_t local_steps = (context.max_steps + context.num_workers - 1) / context.num_workers;
  BatchIterator batches(context.train_shard, config.training.batch_size,
                        config.training.seed * 1000003 + context.worker_index);
  WorkerResult result;
  int64_t generation = -1;  // the restores the clocks below count from
  int64_t base = 0;         // every worker's local step when the generation began
  int64_t step = 0;         // this worker's local step
  // At the start, and after a restore: the clocks of the job's generation,
  // which begin at the restored step's share; a restarted worker goes on
  // from its own clock in them.
  auto join = [&]() -> absl::Status {
    if (context.restores_known == generation) return absl::OkStatus();  // nothing was undone
    generation = context.restores_known;
    int64_t restored = 0;
    if (generation > 0) {
      SHOAL_ASSIGN_OR_RETURN(restored, client.AddToCounter(kRestoredStep, 0));
    }
    base = restored / context.num_workers;
    SHOAL_ASSIGN_OR_RETURN(int64_t clock, client.AddToCounter(ClockCounter(generation, context.worker_index), 0));
    step = base + clock;
    return absl::OkStatus();
  };
  SHOAL_RETURN_IF_ERROR(join());
  auto step_once = [&]() -> absl::StatusOr<bool> {
    if (step >= local_steps) return false;
    if (context.before_step) context.before_step(step);
    if (staleness >= 0 && step - base > staleness) {
      SHOAL_ASSIGN_OR_RETURN(bool go_on, WaitForStepDone(context, generation, step - staleness - 1, timeout));
      if (!go_on) return false;
    }
    // Measure the gap from the workers' own clocks, not from the wait above.
    int64_t slowest = step - base;
    for (int w = 0; w < context.num_workers; ++w) {
      SHOAL_ASSIGN_OR_RETURN(int64_t clock, client.AddToCounter(ClockCounter(generation, w), 0));
      slowest = std::min(slowest, clock);
    }
    SHOAL_RETURN_IF_ERROR(client.AddToCounter(SspGapCounter(step - base - slowest), 1).status());

    SHOAL_ASSIGN_OR_RETURN(BatchResult batch, PullAndComputeGradients(client, model, batches));
    StepInfo info = MakeStepInfo(step + 1, 0, batch, model);
    const std::vector<torch::Tensor> gradients = model.Gradients();
    SHOAL_ASSIGN_OR_RETURN(bool send, CheckUpdate(context, names, gradients, info, &result));
    if (!send) return false;
    SHOAL_ASSIGN_OR_RETURN(std::vector<int64_t> counters,
                           client.ApplyGradients(names, gradients,
                                                 {{kGlobalStep, 1}, {kStopRequested, 0}, {kRestores, 0}}));
    // A restore meanwhile took the gradient as a stale one; this worker's
    // clock belongs to the generation after it.
    if (counters[2] != generation) SHOAL_RETURN_IF_ERROR(JobRewound(context));
    SHOAL_RETURN_IF_ERROR(client.AddToCounter(ClockCounter(generation, context.worker_index), 1).status());
    SHOAL_RETURN_IF_ERROR(client.AddToCounter(StepDoneCounter(generation, step), 1).status());
    ++step;
    info.global_step = counters[0];
    SHOAL_ASSIGN_OR_RETURN(bool go_on, FinishStep(context, info, &result));
    return go_on && counters[1] == 0;
  };
  // A lost ps: the chief restores the newest checkpoint and every worker
  // goes on from its step, in the clocks of the new generation.
  SHOAL_RETURN_IF_ERROR(StepUntilDone(context, names, model.variables(), config.training.optimizer, step_once, join));
  return result;
}

}  // namespace shoal
