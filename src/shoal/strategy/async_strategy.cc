#include "shoal/strategy/async_strategy.h"

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"
#include "shoal/strategy/step_driver.h"

namespace shoal {
namespace {

// Hogwild against the ps: pull, compute, push; the push's counters say
// where the job is. Each push brings back the values right after it
// (Client::ApplyGradientsAndRead), which the next step uses instead of a
// pull of its own: one round trip a step instead of two.
class AsyncPolicy : public StepPolicy {
 public:
  explicit AsyncPolicy(WorkerContext& context) : context_(context) {}
  bool HasStepsLeft() const override { return !done_; }
  int64_t LocalStep() const override { return local_step_; }
  int64_t GlobalStep() const override { return global_step_; }
  absl::Status Join(Model& /*model*/) override {
    pushed_values_.clear();  // rejoining (a ps was lost and restored): pull afresh
    return absl::OkStatus();
  }
  absl::Status Pull(Model& model) override {
    if (pushed_values_.empty()) read_step_ = -1;  // a pull of its own: which step it read is unknown
    return PullUnlessPushed(*context_.client, model, &pushed_values_);
  }
  absl::StatusOr<PushOutcome> Push(Model& model, const std::vector<torch::Tensor>& gradients, StepInfo& step,
                                   const UpdateCheck& check) override {
    pushed_values_.clear();
    SHOAL_ASSIGN_OR_RETURN(bool send, check(model.variable_names(), gradients));
    if (!send) return PushOutcome::kStopped;
    const std::vector<CounterDelta> counters = {{kGlobalStep, 1}, {kStopRequested, 0}, TakeDataPosition(context_)};
    SHOAL_ASSIGN_OR_RETURN(Client::AppliedValues applied,
                           context_.client->ApplyGradientsAndRead(model.variable_names(), gradients, counters,
                                                                                 context_.step_progress,
                                                                                 &context_.step_answer));
    step.global_step = global_step_ = applied.counters[0];
    // The others' updates applied between the read this step trained from
    // and this one: 0 when nobody else pushed.
    if (read_step_ >= 0) step.staleness = static_cast<double>(global_step_ - 1 - read_step_);
    read_step_ = global_step_;
    ++local_step_;
    done_ = applied.counters[1] != 0 || global_step_ >= context_.max_steps;
    if (!done_) pushed_values_ = std::move(applied.values);
    return done_ ? PushOutcome::kLastStep : PushOutcome::kStepDone;
  }

 private:
  WorkerContext& context_;
  int64_t global_step_ = 0, local_step_ = 0;
  int64_t read_step_ = -1;  // the global step the values of the next step were read at (-1: unknown)
  bool done_ = false;
  std::vector<torch::Tensor> pushed_values_;  // the last push's answer, for the next step
};

class Async final : public TrainingMode {
 public:
  std::string name() const override { return "async"; }
  bool LeasesData() const override { return true; }
  std::unique_ptr<TrainingStrategy> MakeStrategy() const override { return std::make_unique<AsyncStrategy>(); }
};

}  // namespace

absl::StatusOr<WorkerResult> AsyncStrategy::RunWorker(WorkerContext& context) {
  AsyncPolicy policy(context);
  return DriveSteps(context, policy);
}

const TrainingMode& AsyncMode() {
  static const Async mode;
  return mode;
}

}  // namespace shoal
