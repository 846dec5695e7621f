#include "shoal/strategy/sync_strategy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"
#include "shoal/strategy/leased_data.h"
#include "shoal/strategy/step_driver.h"

namespace shoal {
namespace {

// SyncReplicas: every worker's gradient goes into the step's accumulators;
// the one that completes a step's R makes its server apply the mean, and
// the barrier's read is the next step's pull.
class SyncPolicy : public StepPolicy {
 public:
  explicit SyncPolicy(WorkerContext& context)
      : context_(context),
        client_(*context.client),
        replicas_(ReplicasToAggregate(*context.config, context.num_workers)),
        me_(context.task.ToString()) {}

  absl::StatusOr<Model*> Start(WorkerContext& context) override {
    if (replicas_ > context.num_workers) {
      return absl::InvalidArgumentError(absl::StrCat("replicas_to_aggregate (", replicas_,
                                                     ") exceeds the number of workers (", context.num_workers,
                                                     "); one worker never contributes several gradients to a step"));
    }
    // A restore puts the accumulators at the checkpoint's global step.
    context.restore_accumulator_step = [](int64_t global_step) -> absl::StatusOr<int64_t> { return global_step; };
    return StepPolicy::Start(context);
  }
  // Where the job is: at the start, and again after a restore put it back.
  absl::Status Join(Model& model) override {
    SHOAL_ASSIGN_OR_RETURN(local_step_, client_.AddToCounter(kGlobalStep, 0));
    global_step_ = local_step_;
    return PullVariables(client_, model);
  }
  bool HasStepsLeft() const override { return local_step_ < context_.max_steps; }
  int64_t LocalStep() const override { return local_step_; }
  int64_t GlobalStep() const override { return local_step_; }
  absl::Status Pull(Model& /*model*/) override { return absl::OkStatus(); }  // the last barrier's read

  absl::StatusOr<PushOutcome> Push(Model& model, const std::vector<torch::Tensor>& gradients, StepInfo& step,
                                   const UpdateCheck& check) override {
    SHOAL_ASSIGN_OR_RETURN(bool send, check(model.variable_names(), gradients));
    if (!send) return PushOutcome::kStopped;
    const std::vector<std::string>& names = model.variable_names();
    // With where this worker's data now stands and, from the chief, the
    // steps the job made since its last word to global_step, in the same
    // call: the counter lags the variables by the chief's compute, and the
    // checkpoints take their step from the barrier's read, not from it.
    std::vector<CounterDelta> counters = {TakeDataPosition(context_)};
    if (const int64_t uncounted = StepsNotCounted(); uncounted > 0) counters.push_back({kGlobalStep, uncounted});
    // On leased data the step takes the gradients of the workers alive
    // (LiveReplicas), as the lease table last counted them.
    if (context_.leased_data != nullptr) replicas_ = LiveReplicas(context_.leased_data->live_workers());
    SHOAL_ASSIGN_OR_RETURN(int dropped, client_.Accumulate(names, gradients, local_step_, me_, replicas_, counters,
                                                                context_.step_progress, &context_.step_answer));
    if (context_.is_chief) global_step_ = local_step_;
    if (dropped > 0) {
      SHOAL_RETURN_IF_ERROR(client_.AddToCounter(kStaleGradients, 1).status());
      ++dropped_;
    }
    step.scalars.emplace_back("sync/stale_gradients_dropped", static_cast<double>(dropped_));
    // The barrier and the next step's pull in one call.
    auto resend = [&]() -> absl::Status {
      SHOAL_RETURN_IF_ERROR(client_.Accumulate(names, gradients, local_step_, me_, replicas_).status());
      return ApplyWithTheLiveWorkers(names);
    };
    SHOAL_ASSIGN_OR_RETURN(StepWait next, ReadAtStepOrStop(context_, names, local_step_ + 1, replicas_, resend));
    if (next.rewound) return PushOutcome::kRewound;
    if (!next.values.ready) return PushOutcome::kStopped;
    model.Load(next.values.values);
    step.global_step = local_step_ = next.values.step;
    return PushOutcome::kStepDone;
  }
  // The chief's word on the last steps, which no accumulate carries.
  absl::Status Finish() override {
    const int64_t uncounted = StepsNotCounted();
    if (uncounted == 0) return absl::OkStatus();
    SHOAL_ASSIGN_OR_RETURN(global_step_, client_.AddToCounter(kGlobalStep, uncounted));
    return absl::OkStatus();
  }

 private:
  // Leased data: the gradients a step takes when workers come and go. The
  // configured replicas_to_aggregate (0: every listed worker), but never
  // more than the workers holding a live lease: one waiting for a free
  // shard has no gradient to give.
  int LiveReplicas(int64_t live_workers) const {
    const int configured = ReplicasToAggregate(*context_.config, context_.num_workers);
    return static_cast<int>(std::clamp<int64_t>(live_workers, 1, configured));
  }
  // A step that waits (every second): when fewer workers are live than the
  // step waits for (one died and its lease ran out, or the others wait for
  // the open epochs' last shards, this worker's among them), the step is
  // applied with the gradients of those live, once it holds that many.
  absl::Status ApplyWithTheLiveWorkers(const std::vector<std::string>& names) {
    if (context_.leased_data == nullptr) return absl::OkStatus();
    SHOAL_ASSIGN_OR_RETURN(const int64_t live, context_.leased_data->AskLiveWorkers());
    const int replicas = LiveReplicas(live);
    if (replicas >= replicas_) return absl::OkStatus();
    replicas_ = replicas;
    std::vector<std::string> workers;  // for the error's names only
    for (const TaskId& w : context_.workers) workers.push_back(w.ToString());
    const absl::Status applied =
        client_.ApplyAccumulated(names, replicas, local_step_ + 1, absl::Milliseconds(200), workers);
    return absl::IsDeadlineExceeded(applied) ? absl::OkStatus() : applied;  // not that many yet: wait on
  }

  // The chief's steps that global_step does not hold yet (0 on the others).
  int64_t StepsNotCounted() const { return context_.is_chief ? std::max<int64_t>(0, local_step_ - global_step_) : 0; }

  WorkerContext& context_;
  Client& client_;
  int replicas_;
  const std::string me_;
  int64_t local_step_ = 0;
  int64_t global_step_ = 0;  // the chief's last word to the global_step counter
  int64_t dropped_ = 0;      // this worker's gradients that came too late for their step
};

class Sync final : public TrainingMode {
 public:
  std::string name() const override { return "sync"; }
  bool LeasesData() const override { return true; }
  bool CheckpointsHoldOneStep() const override { return true; }
  std::unique_ptr<TrainingStrategy> MakeStrategy() const override { return std::make_unique<SyncStrategy>(); }
  absl::Status Validate(const StrategyConfig& config, int workers) const override {
    if (workers > 0 && config.training.replicas_to_aggregate > workers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config: 'training.replicas_to_aggregate' (", config.training.replicas_to_aggregate,
          ") exceeds the number of workers (", workers,
          "); shoal does not let one worker contribute several gradients to a step"));
    }
    return absl::OkStatus();
  }
  int64_t ExamplesPerStep(const StrategyConfig& config, int workers) const override {
    return config.training.batch_size * ReplicasToAggregate(config, workers);
  }
};

}  // namespace

absl::StatusOr<WorkerResult> SyncStrategy::RunWorker(WorkerContext& context) {
  SyncPolicy policy(context);
  return DriveSteps(context, policy);
}

const TrainingMode& SyncMode() {
  static const Sync mode;
  return mode;
}

}  // namespace shoal
