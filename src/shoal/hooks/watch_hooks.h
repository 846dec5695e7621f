// The hooks that let tools users already have watch a worker
// (docs/watching.md): TensorBoard's event files and Prometheus's gauges.
#ifndef SHOAL_HOOKS_WATCH_HOOKS_H_
#define SHOAL_HOOKS_WATCH_HOOKS_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "shoal/hooks/hook.h"
#include "shoal/telemetry/event_file.h"
#include "shoal/telemetry/prometheus_metrics.h"

namespace shoal {

// The folder under hooks.logdir a task's event file goes to ("worker_1").
std::string EventFolderOf(const std::string& logdir, const std::string& job, int index);

// Every `every` local steps, an event at the global step with the window's
// mean loss, batch accuracy (batch AUC for clicks) and staleness, the
// worker's examples/s and learning rate, and the mode's own scalars.
class TensorBoardHook : public TrainingHook {
 public:
  static absl::StatusOr<std::unique_ptr<TensorBoardHook>> Create(const std::string& dir, int64_t every);
  absl::Status AfterStep(const StepInfo& step, StopRequest* stop) override;
  void End(const StepInfo& last, const absl::Status& status) override;

 private:
  TensorBoardHook(std::unique_ptr<EventFileWriter> writer, int64_t every) : writer_(std::move(writer)), every_(every) {}
  absl::Status Write(const StepInfo& step);

  std::unique_ptr<EventFileWriter> writer_;
  int64_t every_;
  double loss_sum_ = 0, accuracy_sum_ = 0, auc_sum_ = 0, staleness_sum_ = 0;
  int64_t steps_ = 0, auc_steps_ = 0, staleness_steps_ = 0;
};

// Each step into the worker's Prometheus series.
class PrometheusHook : public TrainingHook {
 public:
  explicit PrometheusHook(WorkerMetrics* metrics) : metrics_(metrics) {}
  absl::Status AfterStep(const StepInfo& step, StopRequest* stop) override;

 private:
  WorkerMetrics* metrics_;
};

}  // namespace shoal

#endif  // SHOAL_HOOKS_WATCH_HOOKS_H_
