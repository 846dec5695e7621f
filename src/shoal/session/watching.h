// What a process's tasks are watched with, as the config asks
// (docs/watching.md): the Prometheus endpoint (hooks.metrics_port) and the
// trace (hooks.trace); the TensorBoard hooks come with the standard hooks
// (hooks.logdir), and the chief's evaluations with WriteEvaluationEvents.
#ifndef SHOAL_SESSION_WATCHING_H_
#define SHOAL_SESSION_WATCHING_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "shoal/config/config.h"
#include "shoal/server/variable_service.h"
#include "shoal/strategy/strategy.h"
#include "shoal/telemetry/prometheus_metrics.h"
#include "shoal/telemetry/trace.h"

namespace shoal {

class Watching {
 public:
  // `process_tag` names this process's task ("worker_1") when the job's
  // tasks are processes of their own: the trace file is then
  // <trace less .json>.<tag>.json. Empty for a job in one process.
  //
  // The endpoint listens on loopback when `address` (the task's, empty
  // for a job in one process) is a loopback one, and also when the job has
  // neither a token nor security.insecure, as the task's own port would
  // refuse to; otherwise on every interface, and with a token a scrape must
  // give it as HTTP basic auth's password.
  static absl::StatusOr<std::unique_ptr<Watching>> Start(const JobConfig& config, const std::string& process_tag,
                                                         const std::string& address = "");

  // Before the server serves: its requests counted and traced.
  void WatchServer(VariableService& service, const TaskId& task);
  // Before the worker trains.
  void WatchWorker(WorkerContext& context);
  // At the end: writes the trace, saying where on stderr.
  absl::Status Finish();
  int metrics_port() const { return endpoint_ == nullptr ? 0 : endpoint_->port(); }
  bool empty() const { return endpoint_ == nullptr && tracer_ == nullptr; }

 private:
  std::unique_ptr<MetricsEndpoint> endpoint_;
  std::unique_ptr<Tracer> tracer_;
};

// The trace file of a task process (see Watching::Start).
std::string TraceFileOf(const std::string& trace, const std::string& process_tag);

// An evaluation's scalars for TensorBoard: test/accuracy and test/loss, or,
// with an AUC (a click model), test/auc and test/log_loss.
std::vector<std::pair<std::string, double>> EvaluationScalars(double accuracy, double loss,
                                                              std::optional<double> auc);

// The chief's evaluation at `step` into hooks.logdir's own event file,
// beside the workers' folders.
absl::Status WriteEvaluationEvents(const std::string& logdir, int64_t step,
                                   const std::vector<std::pair<std::string, double>>& scalars);

}  // namespace shoal

#endif  // SHOAL_SESSION_WATCHING_H_
