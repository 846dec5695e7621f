// Prometheus's /metrics for a process's tasks (prometheus-cpp's registry
// and text format, served by ScrapeListener): a worker's steps, rate, loss, phase seconds and staleness; a ps
// task's requests by kind and code, bytes, handling seconds, what it holds,
// and its waiting calls. Every series carries a `task` label ("worker:0"),
// so one endpoint serves every task of an in-process job.
//
// Off (hooks.metrics_port 0), none of this exists and the hot paths test a
// null pointer.
#ifndef SHOAL_TELEMETRY_PROMETHEUS_METRICS_H_
#define SHOAL_TELEMETRY_PROMETHEUS_METRICS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "shoal/telemetry/phase.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace shoal {

struct MetricsEndpointOptions {
  std::string bind_address;  // "127.0.0.1:9100"; port 0: the kernel picks
  // When set, a scrape must give it as HTTP basic auth's password (any user
  // name): the job's token.
  std::string password;
};

class ScrapeListener;
class WorkerMetrics;
class ServerMetrics;

// One HTTP endpoint, /metrics, for every task of this process.
class MetricsEndpoint {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const MetricsEndpointOptions& options);
  ~MetricsEndpoint();
  int port() const { return port_; }

  std::unique_ptr<WorkerMetrics> ForWorker(const std::string& task);
  // `held`, read at each scrape while the result lives: the variables and
  // table rows the task holds.
  std::unique_ptr<ServerMetrics> ForServer(const std::string& task,
                                           std::function<void(int64_t* variables, int64_t* rows)> held);

 private:
  MetricsEndpoint() = default;
  std::unique_ptr<ScrapeListener> listener_;
  std::shared_ptr<prometheus::Registry> registry_;
  int port_ = 0;

 public:
  class HeldCollectable;

 private:
  std::shared_ptr<HeldCollectable> held_;
};

class WorkerMetrics {
 public:
  virtual ~WorkerMetrics() = default;
  // After each local step. staleness < 0: the mode has none.
  virtual void StepDone(int64_t examples, double loss, double examples_per_second, double staleness) = 0;
  virtual void PhaseDone(Phase phase, double seconds) = 0;
};

class ServerMetrics {
 public:
  virtual ~ServerMetrics() = default;
  // A request of kind `op` answered with `code` (absl's), after `seconds`.
  virtual void Served(const std::string& op, int code, int64_t bytes_in, int64_t bytes_out, double seconds) = 0;
  // A call that may wait (a long poll, a barrier) began (+1) or ended (-1).
  virtual void Waiting(int delta) = 0;
};

}  // namespace shoal

#endif  // SHOAL_TELEMETRY_PROMETHEUS_METRICS_H_
