#include "shoal/strategy/async_strategy.h"

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"
#include "shoal/strategy/step_driver.h"

namespace shoal {
namespace {

// Hogwild against the ps: pull, compute, push; the push's counters say
// where the job is.
class AsyncPolicy : public StepPolicy {
 public:
  explicit AsyncPolicy(WorkerContext& context) : context_(context) {}
  bool HasStepsLeft() const override { return !done_; }
  int64_t LocalStep() const override { return local_step_; }
  int64_t GlobalStep() const override { return global_step_; }
  absl::Status Pull(Model& model) override {
    return PullVariables(*context_.client, model);
  }
  absl::StatusOr<PushOutcome> Push(Model& model, const std::vector<torch::Tensor>& gradients, StepInfo& step,
                                   const UpdateCheck& check) override {
    SHOAL_ASSIGN_OR_RETURN(bool send, check(model.variable_names(), gradients));
    if (!send) return PushOutcome::kStopped;
    SHOAL_ASSIGN_OR_RETURN(std::vector<int64_t> counters,
                           context_.client->ApplyGradients(model.variable_names(), gradients,
                                                           {{kGlobalStep, 1}, {kStopRequested, 0}}));
    step.global_step = global_step_ = counters[0];
    ++local_step_;
    done_ = counters[1] != 0 || global_step_ >= context_.max_steps;
    return done_ ? PushOutcome::kLastStep : PushOutcome::kStepDone;
  }

 private:
  WorkerContext& context_;
  int64_t global_step_ = 0, local_step_ = 0;
  bool done_ = false;
};

class Async final : public TrainingMode {
 public:
  std::string name() const override { return "async"; }
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
