#include "shoal/hooks/watch_hooks.h"

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"

namespace shoal {

std::string EventFolderOf(const std::string& logdir, const std::string& job, int index) {
  return absl::StrCat(logdir, "/", job, "_", index);
}

absl::StatusOr<std::unique_ptr<TensorBoardHook>> TensorBoardHook::Create(const std::string& dir, int64_t every) {
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<EventFileWriter> writer, EventFileWriter::Create(dir));
  return std::unique_ptr<TensorBoardHook>(new TensorBoardHook(std::move(writer), every));
}

absl::Status TensorBoardHook::AfterStep(const StepInfo& step, StopRequest*) {
  loss_sum_ += step.loss;
  accuracy_sum_ += step.accuracy;
  if (step.auc >= 0) {
    auc_sum_ += step.auc;
    ++auc_steps_;
  }
  if (step.staleness >= 0) {
    staleness_sum_ += step.staleness;
    ++staleness_steps_;
  }
  if (++steps_ < every_) return absl::OkStatus();
  return Write(step);
}

absl::Status TensorBoardHook::Write(const StepInfo& step) {
  std::vector<std::pair<std::string, double>> scalars = {{"loss", loss_sum_ / steps_},
                                                         {"batch_accuracy", accuracy_sum_ / steps_},
                                                         {"examples_per_second", step.examples_per_second}};
  if (auc_steps_ > 0) scalars.emplace_back("batch_auc", auc_sum_ / auc_steps_);
  if (staleness_steps_ > 0) scalars.emplace_back("staleness", staleness_sum_ / staleness_steps_);
  if (step.learning_rate >= 0) scalars.emplace_back("learning_rate", step.learning_rate);
  scalars.insert(scalars.end(), step.scalars.begin(), step.scalars.end());
  loss_sum_ = accuracy_sum_ = auc_sum_ = staleness_sum_ = 0;
  steps_ = auc_steps_ = staleness_steps_ = 0;
  return writer_->AddScalars(step.global_step, scalars);
}

void TensorBoardHook::End(const StepInfo& last, const absl::Status&) {
  if (steps_ > 0) Write(last).IgnoreError();  // the last, partial window
  writer_->Flush().IgnoreError();
}

absl::Status PrometheusHook::AfterStep(const StepInfo& step, StopRequest*) {
  metrics_->StepDone(step.examples, step.loss, step.examples_per_second, step.staleness);
  return absl::OkStatus();
}

}  // namespace shoal
