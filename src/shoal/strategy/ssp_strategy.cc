#include "shoal/strategy/ssp_strategy.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"
#include "shoal/strategy/step_driver.h"

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

// Stale synchronous parallel: async pushes, with each worker's clock kept
// on the counter task and a wait at the staleness bound.
//
// A step makes at most three round trips: its pull, its push, and one
// counter request after the push that moves this worker's clock, marks its step
// done, counts its gap, and reads what the next steps need to know (the
// workers' clocks, and whether the steps the bound waits for are done).
// The "done" mark must follow the push's answer, so that a worker who
// sees it pulls values holding the update. When the next step's bound is
// already known to hold at the push, the push also brings back the values
// (Client::ApplyGradientsAndRead), and the next step's pull is skipped:
// every update that step must see was applied before that read.
class SspPolicy : public StepPolicy {
 public:
  explicit SspPolicy(WorkerContext& context)
      : context_(context),
        client_(*context.client),
        staleness_(context.config->training.staleness),
        timeout_(absl::Seconds(context.config->training.sync_timeout_s)),
        local_steps_((context.max_steps + context.num_workers - 1) / context.num_workers) {}

  // At the start, and after a restore: the clocks of the job's generation,
  // which begin at the restored step's share; a restarted worker goes on
  // from its own clock in them.
  absl::Status Join(Model& /*model*/) override {
    if (context_.restores_known == generation_) return absl::OkStatus();  // nothing was undone
    generation_ = context_.restores_known;
    known_.reset();
    pushed_values_.clear();
    int64_t restored = 0;
    if (generation_ > 0) {
      SHOAL_ASSIGN_OR_RETURN(restored, client_.AddToCounter(kRestoredStep, 0));
    }
    base_ = restored / context_.num_workers;
    SHOAL_ASSIGN_OR_RETURN(int64_t clock, client_.AddToCounter(ClockCounter(generation_, context_.worker_index), 0));
    step_ = base_ + clock;
    return absl::OkStatus();
  }
  bool HasStepsLeft() const override { return step_ < local_steps_; }
  int64_t LocalStep() const override { return step_; }
  int64_t GlobalStep() const override { return 0; }

  absl::StatusOr<bool> Barrier() override {
    // What the last step's counter request read, if it was about this step.
    const Known* known = KnownAbout(step_);
    const bool next_bound_done = known != nullptr && known->next_bound_done;
    if (MustWait(step_) && !(known != nullptr && known->bound_done)) {
      pushed_values_.clear();  // read before the wait: too old for this step
      SHOAL_ASSIGN_OR_RETURN(bool go_on, WaitForStepDone(context_, generation_, step_ - staleness_ - 1, timeout_));
      if (!go_on) return false;
      known_.reset();  // the clocks moved meanwhile
    }
    // The gap is measured from the workers' own clocks, not from the wait.
    std::vector<int64_t> clocks;
    if (const Known* still_known = KnownAbout(step_)) {
      clocks = still_known->clocks;
    } else {
      for (int w = 0; w < context_.num_workers; ++w) {
        SHOAL_ASSIGN_OR_RETURN(int64_t clock, client_.AddToCounter(ClockCounter(generation_, w), 0));
        clocks.push_back(clock);
      }
    }
    int64_t slowest = step_ - base_;
    for (int64_t clock : clocks) slowest = std::min(slowest, clock);
    gap_ = step_ - base_ - slowest;
    // The push may bring back the next step's values if that step's bound
    // holds already (its waited-for steps are done, or it waits for none).
    read_at_push_ = !MustWait(step_ + 1) || next_bound_done;
    return true;
  }

  absl::Status Pull(Model& model) override { return PullUnlessPushed(client_, model, &pushed_values_); }

  absl::StatusOr<PushOutcome> Push(Model& model, const std::vector<torch::Tensor>& gradients, StepInfo& step,
                                   const UpdateCheck& check) override {
    SHOAL_ASSIGN_OR_RETURN(bool send, check(model.variable_names(), gradients));
    if (!send) return PushOutcome::kStopped;
    const std::vector<CounterDelta> counters = {
        {kGlobalStep, 1}, {kStopRequested, 0}, {kRestores, 0}, TakeDataPosition(context_)};
    Client::AppliedValues applied;
    if (read_at_push_) {
      SHOAL_ASSIGN_OR_RETURN(applied, client_.ApplyGradientsAndRead(model.variable_names(), gradients, counters));
    } else {
      SHOAL_ASSIGN_OR_RETURN(applied.counters, client_.ApplyGradients(model.variable_names(), gradients, counters));
    }
    // A restore meanwhile took the gradient as a stale one; this worker's
    // clock belongs to the generation after it.
    if (applied.counters[2] != generation_) SHOAL_RETURN_IF_ERROR(JobRewound(context_));
    SHOAL_RETURN_IF_ERROR(FinishClock());
    step.local_step = step_;
    step.global_step = applied.counters[0];
    if (applied.counters[1] != 0) return PushOutcome::kLastStep;
    pushed_values_ = std::move(applied.values);
    return PushOutcome::kStepDone;
  }

 private:
  // What a step's counter request learnt for the step after it.
  struct Known {
    int64_t step;               // the step it is about
    bool bound_done;            // every worker finished the step this one waits for
    bool next_bound_done;       // ... and the one the step after it waits for
    std::vector<int64_t> clocks;  // every worker's clock
  };

  bool MustWait(int64_t step) const { return staleness_ >= 0 && step - base_ > staleness_; }
  const Known* KnownAbout(int64_t step) const {
    return known_.has_value() && known_->step == step ? &*known_ : nullptr;
  }

  // After the push: this worker's clock and step-done mark, its step's gap,
  // and reads for the next step, in one request.
  absl::Status FinishClock() {
    const int64_t next = step_ + 1;
    std::vector<CounterDelta> counters = {{ClockCounter(generation_, context_.worker_index), 1},
                                          {StepDoneCounter(generation_, step_), 1},
                                          {SspGapCounter(gap_), 1},
                                          {StepDoneCounter(generation_, next - staleness_ - 1), 0},
                                          {StepDoneCounter(generation_, next - staleness_), 0}};
    for (int w = 0; w < context_.num_workers; ++w) counters.push_back({ClockCounter(generation_, w), 0});
    SHOAL_ASSIGN_OR_RETURN(std::vector<int64_t> values, client_.AddToCounters(counters));
    step_ = next;
    known_ = Known{next, values[3] >= context_.num_workers, values[4] >= context_.num_workers,
                   std::vector<int64_t>(values.begin() + 5, values.end())};
    return absl::OkStatus();
  }

  WorkerContext& context_;
  Client& client_;
  const int64_t staleness_;
  const absl::Duration timeout_;
  const int64_t local_steps_;
  int64_t generation_ = -1;  // the restores the clocks count from
  int64_t base_ = 0;         // every worker's local step when the generation began
  int64_t step_ = 0;         // this worker's local step
  int64_t gap_ = 0;          // this step's clock gap to the slowest worker
  bool read_at_push_ = false;
  std::optional<Known> known_;
  std::vector<torch::Tensor> pushed_values_;  // the last push's answer, for the next step
};

class Ssp final : public TrainingMode {
 public:
  std::string name() const override { return "ssp"; }
  std::unique_ptr<TrainingStrategy> MakeStrategy() const override { return std::make_unique<SspStrategy>(); }
  // The default report, and the histogram of clock gaps, read well past the
  // bound so that a violation would show.
  absl::Status Report(WorkerContext& context, const Dataset& test_set, TrainReport* report) const override {
    SHOAL_RETURN_IF_ERROR(TrainingMode::Report(context, test_set, report));
    const int64_t limit = std::max<int64_t>(context.config->training.staleness, 0) + 16;
    for (int64_t gap = 0; gap <= limit; ++gap) {
      SHOAL_ASSIGN_OR_RETURN(int64_t steps, context.client->AddToCounter(SspGapCounter(gap), 0));
      report->ssp_gap_histogram.push_back(steps);
    }
    while (!report->ssp_gap_histogram.empty() && report->ssp_gap_histogram.back() == 0) {
      report->ssp_gap_histogram.pop_back();
    }
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<WorkerResult> SspStrategy::RunWorker(WorkerContext& context) {
  SspPolicy policy(context);
  return DriveSteps(context, policy);
}

const TrainingMode& SspMode() {
  static const Ssp mode;
  return mode;
}

}  // namespace shoal
