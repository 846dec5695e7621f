// The hooks a job's config can turn on (config `hooks:`), one class each.
#ifndef SHOAL_HOOKS_STANDARD_HOOKS_H_
#define SHOAL_HOOKS_STANDARD_HOOKS_H_

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "shoal/hooks/hook.h"

namespace shoal {

// The hooks every worker runs (config `hooks:`).
struct HooksConfig {
  int64_t log_every_steps = 0;      // a log line per worker every N local steps; 0: off
  std::string nan_guard = "fail";   // non-finite loss or update: fail | stop | off
  int64_t stop_at_step = 0;         // the first worker to see this global step stops the job; 0: none
  std::string metrics_dir;          // per-task metrics files here; empty: none
  std::string metrics_format = "jsonl";  // jsonl | csv
  int64_t metrics_every_steps = 10;
  // Where the chief leaves the trained model and the report at the end
  // (session/run_folder.h): a folder per job under run_dir, named run_name
  // or the time; run_dir empty: none.
  std::string run_dir = "runs";
  std::string run_name;
  // Watching a run (docs/watching.md): TensorBoard event files under logdir
  // (the chief's evaluations in it, each worker's steps in worker_<i>/);
  // Prometheus's /metrics on metrics_port (0: off); a Chrome trace written
  // to `trace` at the end, of the steps trace_steps names ("A:B", or "N":
  // each worker's last N).
  std::string logdir;
  int metrics_port = 0;
  std::string trace;
  std::string trace_steps = "100";
};

// Keeps non-finite numbers away from the ps: checks each step's loss and
// every tensor of each update before it is sent. `fail` returns an error
// naming the task, the step and the variable; `stop` stops the job cleanly
// with that reason. The update is never sent.
class NanGuardHook : public TrainingHook {
 public:
  enum class Action { kFail, kStop };
  NanGuardHook(std::string task, Action action) : task_(std::move(task)), action_(action) {}
  absl::Status BeforeUpdate(const std::vector<std::string>& names, const std::vector<torch::Tensor>& update,
                            const StepInfo& step, StopRequest* stop) override;

 private:
  absl::Status Found(const std::string& what, const StepInfo& step, StopRequest* stop) const;
  std::string task_;
  Action action_;
};

// Stops the job once the global step this worker last saw reaches
// `last_step`. Every worker runs it (as TensorFlow's StopAtStepHook runs in
// every worker's session): the first to see the step stops the job, so a
// chief held up by its scheduler does not let the others run on past it.
class StopAtStepHook : public TrainingHook {
 public:
  explicit StopAtStepHook(int64_t last_step) : last_step_(last_step) {}
  absl::Status AfterStep(const StepInfo& step, StopRequest* stop) override;
  static std::string Reason(int64_t last_step);

 private:
  int64_t last_step_;
};

// Stops the job after the step in progress once `*signal` is set (to the
// number of the signal that asked: SIGINT, SIGTERM). The chief then saves a
// final checkpoint, evaluates and reports, as at the end of training.
class StopOnSignalHook : public TrainingHook {
 public:
  explicit StopOnSignalHook(const std::atomic<int>* signal) : signal_(signal) {}
  absl::Status AfterStep(const StepInfo& step, StopRequest* stop) override;

 private:
  const std::atomic<int>* signal_;
};

// A line on `out` every `every` local steps: the mean loss and batch accuracy
// since the last line, and the worker's examples/s.
class LoggingHook : public TrainingHook {
 public:
  LoggingHook(std::string task, int64_t every, std::FILE* out) : task_(std::move(task)), every_(every), out_(out) {}
  absl::Status AfterStep(const StepInfo& step, StopRequest* stop) override;

 private:
  std::string task_;
  int64_t every_;
  std::FILE* out_;
  double loss_sum_ = 0, accuracy_sum_ = 0;
  int64_t steps_ = 0;
};

// Appends a record every `every` local steps to this task's metrics file,
// as JSON lines or CSV: time, steps, mean loss and batch accuracy over the
// window, examples/s. `shoal plot` draws them.
class MetricsHook : public TrainingHook {
 public:
  // Writes <dir>/<job>_<index>.<jsonl|csv>, replacing an older file.
  static absl::StatusOr<std::unique_ptr<MetricsHook>> Create(const std::string& dir, const std::string& job,
                                                             int index, const std::string& format, int64_t every);
  absl::Status AfterStep(const StepInfo& step, StopRequest* stop) override;
  void End(const StepInfo& last, const absl::Status& status) override;

 private:
  MetricsHook(std::string path, std::string task, bool csv, int64_t every);
  absl::Status Write(const StepInfo& step);

  std::string path_, task_;
  bool csv_;
  int64_t every_;
  std::ofstream out_;
  absl::Time start_ = absl::Now();
  double loss_sum_ = 0, accuracy_sum_ = 0, auc_sum_ = 0;
  int64_t steps_ = 0, auc_steps_ = 0;  // auc: over the window's steps that had one
};

// This task's metrics file name in a metrics directory ("worker_1.jsonl").
std::string MetricsFileName(const std::string& job, int index, const std::string& format);

// The hooks `config` asks for, for one worker task.
absl::StatusOr<std::unique_ptr<HookList>> MakeStandardHooks(const HooksConfig& config, const std::string& job,
                                                            int index);

}  // namespace shoal

#endif  // SHOAL_HOOKS_STANDARD_HOOKS_H_
