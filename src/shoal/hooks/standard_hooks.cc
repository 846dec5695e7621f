#include "shoal/hooks/standard_hooks.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shoal/core/status.h"
#include "shoal/hooks/watch_hooks.h"
#include "shoal/server/variable_store.h"

namespace shoal {

absl::Status NanGuardHook::Found(const std::string& what, const StepInfo& step, StopRequest* stop) const {
  const std::string message =
      absl::StrCat(task_, ": ", what, " at local step ", step.local_step, "; nothing was sent to the ps");
  if (action_ == Action::kFail) return absl::FailedPreconditionError(message);
  stop->Request(message);
  return absl::OkStatus();
}

absl::Status NanGuardHook::BeforeUpdate(const std::vector<std::string>& names,
                                        const std::vector<torch::Tensor>& update, const StepInfo& step,
                                        StopRequest* stop) {
  if (!std::isfinite(step.loss)) return Found(absl::StrCat("the loss is ", step.loss), step, stop);
  for (size_t i = 0; i < update.size() && i < names.size(); ++i) {
    if (!AllFinite(update[i])) return Found(absl::StrCat("the update for '", names[i], "' is not finite"), step, stop);
  }
  return absl::OkStatus();
}

absl::Status StopAtStepHook::AfterStep(const StepInfo& step, StopRequest* stop) {
  if (step.global_step >= last_step_) stop->Request(Reason(last_step_));
  return absl::OkStatus();
}

std::string StopAtStepHook::Reason(int64_t last_step) { return absl::StrCat("stop_at_step ", last_step, " reached"); }

absl::Status LoggingHook::AfterStep(const StepInfo& step, StopRequest*) {
  loss_sum_ += step.loss;
  accuracy_sum_ += step.accuracy;
  if (++steps_ < every_) return absl::OkStatus();
  absl::FPrintF(out_, "%s step %d (global %d): loss %.4f, batch accuracy %.3f, %.0f examples/s\n", task_,
                step.local_step, step.global_step, loss_sum_ / steps_, accuracy_sum_ / steps_,
                step.examples_per_second);
  std::fflush(out_);
  loss_sum_ = accuracy_sum_ = 0;
  steps_ = 0;
  return absl::OkStatus();
}

std::string MetricsFileName(const std::string& job, int index, const std::string& format) {
  return absl::StrCat(job, "_", index, format == "csv" ? ".csv" : ".jsonl");
}

absl::StatusOr<std::unique_ptr<MetricsHook>> MetricsHook::Create(const std::string& dir, const std::string& job,
                                                                 int index, const std::string& format,
                                                                 int64_t every) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create metrics directory '", dir, "': ", error.message()));
  }
  const std::string path = (std::filesystem::path(dir) / MetricsFileName(job, index, format)).string();
  auto hook = std::unique_ptr<MetricsHook>(
      new MetricsHook(path, absl::StrCat("/job:", job, "/task:", index), format == "csv", every));
  if (!hook->out_) return absl::FailedPreconditionError(absl::StrCat("cannot write metrics file '", hook->path_, "'"));
  if (hook->csv_) hook->out_ << "task,time_s,local_step,global_step,loss,accuracy,examples_per_second,auc\n";
  return hook;
}

MetricsHook::MetricsHook(std::string path, std::string task, bool csv, int64_t every)
    : path_(std::move(path)), task_(std::move(task)), csv_(csv), every_(every), out_(path_, std::ios::trunc) {}

absl::Status MetricsHook::Write(const StepInfo& step) {
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start_);
  const double loss = loss_sum_ / steps_, accuracy = accuracy_sum_ / steps_;
  // Click models: the mean of the window's batch AUCs (the loss is their log loss).
  const std::string auc = auc_steps_ > 0 ? absl::StrFormat("%.6g", auc_sum_ / auc_steps_) : "";
  if (csv_) {
    out_ << absl::StrFormat("%s,%.3f,%d,%d,%.6g,%.6g,%.1f,%s\n", task_, seconds, step.local_step, step.global_step,
                            loss, accuracy, step.examples_per_second, auc);
  } else {
    nlohmann::json record = {{"task", task_},          {"time_s", seconds},
                             {"unix_time", absl::ToUnixMicros(absl::Now()) / 1e6},
                             {"local_step", step.local_step}, {"global_step", step.global_step},
                             {"loss", loss},           {"accuracy", accuracy},
                             {"examples_per_second", step.examples_per_second}};
    if (auc_steps_ > 0) record["auc"] = auc_sum_ / auc_steps_;
    out_ << record.dump() << "\n";
  }
  out_.flush();
  loss_sum_ = accuracy_sum_ = auc_sum_ = 0;
  steps_ = auc_steps_ = 0;
  if (!out_) return absl::DataLossError(absl::StrCat("writing metrics file '", path_, "' failed"));
  return absl::OkStatus();
}

absl::Status MetricsHook::AfterStep(const StepInfo& step, StopRequest*) {
  loss_sum_ += step.loss;
  accuracy_sum_ += step.accuracy;
  if (step.auc >= 0) {
    auc_sum_ += step.auc;
    ++auc_steps_;
  }
  if (++steps_ < every_) return absl::OkStatus();
  return Write(step);
}

void MetricsHook::End(const StepInfo& last, const absl::Status&) {
  if (steps_ > 0) Write(last).IgnoreError();  // the last, partial window
}

absl::StatusOr<std::unique_ptr<HookList>> MakeStandardHooks(const HooksConfig& config, const std::string& job,
                                                            int index) {
  const std::string task = absl::StrCat("/job:", job, "/task:", index);
  auto hooks = std::make_unique<HookList>();
  if (config.nan_guard != "off") {
    hooks->Add(std::make_unique<NanGuardHook>(
        task, config.nan_guard == "stop" ? NanGuardHook::Action::kStop : NanGuardHook::Action::kFail));
  }
  if (config.stop_at_step > 0) hooks->Add(std::make_unique<StopAtStepHook>(config.stop_at_step));
  if (config.log_every_steps > 0) hooks->Add(std::make_unique<LoggingHook>(task, config.log_every_steps, stderr));
  if (!config.metrics_dir.empty()) {
    SHOAL_ASSIGN_OR_RETURN(auto metrics,
                           MetricsHook::Create(config.metrics_dir, job, index, config.metrics_format,
                                               config.metrics_every_steps));
    hooks->Add(std::move(metrics));
  }
  if (!config.logdir.empty()) {
    SHOAL_ASSIGN_OR_RETURN(auto events, TensorBoardHook::Create(EventFolderOf(config.logdir, job, index),
                                                                config.metrics_every_steps));
    hooks->Add(std::move(events));
  }
  return hooks;
}

absl::Status StopOnSignalHook::AfterStep(const StepInfo& step, StopRequest* stop) {
  if (const int signal = signal_->load(); signal != 0) {
    stop->Request(absl::StrCat("stopped by signal ", signal, " (", strsignal(signal), ") after global step ",
                               step.global_step));
  }
  return absl::OkStatus();
}

}  // namespace shoal
