#include "shoal/telemetry/prometheus_metrics.h"

#include <unistd.h>

#include <fstream>
#include <map>
#include <mutex>
#include <tuple>

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "absl/strings/str_cat.h"
#include "shoal/telemetry/scrape_listener.h"

namespace shoal {
namespace {

// Seconds from 50 us to 10 s: a pull on loopback to a barrier's wait.
prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};
}

class PrometheusWorkerMetrics : public WorkerMetrics {
 public:
  PrometheusWorkerMetrics(prometheus::Registry& registry, const std::string& task)
      : steps_(prometheus::BuildCounter()
                   .Name("shoal_worker_steps_total")
                   .Help("Local steps this worker finished")
                   .Register(registry)
                   .Add({{"task", task}})),
        examples_(prometheus::BuildCounter()
                      .Name("shoal_worker_examples_total")
                      .Help("Examples this worker trained on")
                      .Register(registry)
                      .Add({{"task", task}})),
        rate_(prometheus::BuildGauge()
                  .Name("shoal_worker_examples_per_second")
                  .Help("This worker's examples per second over the last few seconds")
                  .Register(registry)
                  .Add({{"task", task}})),
        loss_(prometheus::BuildGauge()
                  .Name("shoal_worker_loss")
                  .Help("The loss of this worker's last batch")
                  .Register(registry)
                  .Add({{"task", task}})),
        staleness_(prometheus::BuildGauge()
                       .Name("shoal_worker_staleness_steps")
                       .Help("async: global steps applied by others between this worker's read and its push")
                       .Register(registry)
                       .Add({{"task", task}})) {
    auto& phases = prometheus::BuildHistogram()
                       .Name("shoal_worker_phase_seconds")
                       .Help("Seconds a step spent in each phase (pull, compute, push, wait, checkpoint)")
                       .Register(registry);
    for (int p = 0; p < kPhaseCount; ++p) {
      phase_[p] = &phases.Add({{"task", task}, {"phase", PhaseName(static_cast<Phase>(p))}}, SecondsBuckets());
    }
  }
  void StepDone(int64_t examples, double loss, double examples_per_second, double staleness) override {
    steps_.Increment();
    examples_.Increment(static_cast<double>(examples));
    loss_.Set(loss);
    rate_.Set(examples_per_second);
    if (staleness >= 0) staleness_.Set(staleness);
  }
  void PhaseDone(Phase phase, double seconds) override { phase_[static_cast<int>(phase)]->Observe(seconds); }

 private:
  prometheus::Counter& steps_;
  prometheus::Counter& examples_;
  prometheus::Gauge& rate_;
  prometheus::Gauge& loss_;
  prometheus::Gauge& staleness_;
  prometheus::Histogram* phase_[kPhaseCount];
};

class PrometheusServerMetrics : public ServerMetrics {
 public:
  PrometheusServerMetrics(prometheus::Registry& registry, const std::string& task)
      : task_(task),
        requests_(prometheus::BuildCounter()
                      .Name("shoal_ps_requests_total")
                      .Help("Requests this task served, by kind and status code")
                      .Register(registry)),
        seconds_(prometheus::BuildHistogram()
                     .Name("shoal_ps_request_seconds")
                     .Help("Seconds this task took to handle a request, by kind (apply_gradients: the apply)")
                     .Register(registry)),
        bytes_in_(prometheus::BuildCounter()
                      .Name("shoal_ps_received_bytes_total")
                      .Help("Request bytes (header and tensors) this task received")
                      .Register(registry)
                      .Add({{"task", task}})),
        bytes_out_(prometheus::BuildCounter()
                       .Name("shoal_ps_sent_bytes_total")
                       .Help("Response bytes (header and tensors) this task sent")
                       .Register(registry)
                       .Add({{"task", task}})),
        waiting_(prometheus::BuildGauge()
                     .Name("shoal_ps_waiting_calls")
                     .Help("Calls held open on this task now (long polls of a counter, barriers)")
                     .Register(registry)
                     .Add({{"task", task}})) {}

  void Served(const std::string& op, int code, int64_t bytes_in, int64_t bytes_out, double seconds) override {
    prometheus::Counter* requests;
    prometheus::Histogram* handling;
    {
      // Family::Add is thread-safe but hashes the labels each time: keep the
      // series a kind and code made.
      std::lock_guard<std::mutex> lock(mu_);
      auto& counter = by_code_[{op, code}];
      if (counter == nullptr) {
        counter = &requests_.Add({{"task", task_}, {"kind", op}, {"code", StatusCodeName(code)}});
      }
      requests = counter;
      auto& histogram = by_kind_[op];
      if (histogram == nullptr) histogram = &seconds_.Add({{"task", task_}, {"kind", op}}, SecondsBuckets());
      handling = histogram;
    }
    requests->Increment();
    handling->Observe(seconds);
    bytes_in_.Increment(static_cast<double>(bytes_in));
    bytes_out_.Increment(static_cast<double>(bytes_out));
  }
  void Waiting(int delta) override { waiting_.Increment(delta); }

 private:
  static std::string StatusCodeName(int code) {
    static const char* const kNames[] = {"OK",       "CANCELLED",          "UNKNOWN",           "INVALID_ARGUMENT",
                                         "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",    "PERMISSION_DENIED",
                                         "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                                         "UNIMPLEMENTED", "INTERNAL",    "UNAVAILABLE",       "DATA_LOSS",
                                         "UNAUTHENTICATED"};
    return code >= 0 && code <= 16 ? kNames[code] : absl::StrCat(code);
  }

  const std::string task_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& seconds_;
  prometheus::Counter& bytes_in_;
  prometheus::Counter& bytes_out_;
  prometheus::Gauge& waiting_;
  std::mutex mu_;
  std::map<std::pair<std::string, int>, prometheus::Counter*> by_code_;
  std::map<std::string, prometheus::Histogram*> by_kind_;
};

}  // namespace

// Read at each scrape: what each ps task of the process holds, and the
// process's memory. One for the endpoint, so that each family is written once.
class MetricsEndpoint::HeldCollectable : public prometheus::Collectable {
 public:
  void Add(const std::string& task, std::function<void(int64_t*, int64_t*)> held) {
    std::lock_guard<std::mutex> lock(mu_);
    held_[task] = std::move(held);
  }
  void Remove(const std::string& task) {
    std::lock_guard<std::mutex> lock(mu_);
    held_.erase(task);
  }
  std::vector<prometheus::MetricFamily> Collect() const override {
    prometheus::MetricFamily variables{"shoal_ps_variables", "Variables (and partitions) a task holds",
                                       prometheus::MetricType::Gauge, {}};
    prometheus::MetricFamily rows{"shoal_ps_table_rows", "Embedding-table rows a task holds",
                                  prometheus::MetricType::Gauge, {}};
    auto add = [](prometheus::MetricFamily& family, const std::string& task, double value) {
      prometheus::ClientMetric metric;
      if (!task.empty()) metric.label = {{"task", task}};
      metric.gauge.value = value;
      family.metric.push_back(metric);
    };
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [task, held] : held_) {
        int64_t v = 0, r = 0;
        held(&v, &r);
        add(variables, task, static_cast<double>(v));
        add(rows, task, static_cast<double>(r));
      }
    }
    prometheus::MetricFamily memory{"shoal_process_resident_bytes", "Resident memory of this process",
                                    prometheus::MetricType::Gauge, {}};
    add(memory, "", ResidentBytes());
    return {variables, rows, memory};
  }

 private:
  static double ResidentBytes() {
    std::ifstream statm("/proc/self/statm");
    long pages_total = 0, pages_resident = 0;
    if (!(statm >> pages_total >> pages_resident)) return 0;
    return static_cast<double>(pages_resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
  }
  mutable std::mutex mu_;
  std::map<std::string, std::function<void(int64_t*, int64_t*)>> held_;
};

namespace {

// A ps task's series; its figures of what it holds leave the scrape with it.
class ScrapedServerMetrics : public PrometheusServerMetrics {
 public:
  ScrapedServerMetrics(prometheus::Registry& registry, const std::string& task,
                       std::shared_ptr<MetricsEndpoint::HeldCollectable> held)
      : PrometheusServerMetrics(registry, task), task_(task), held_(std::move(held)) {}
  ~ScrapedServerMetrics() override { held_->Remove(task_); }

 private:
  const std::string task_;
  const std::shared_ptr<MetricsEndpoint::HeldCollectable> held_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const MetricsEndpointOptions& options) {
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  endpoint->registry_ = std::make_shared<prometheus::Registry>();
  endpoint->held_ = std::make_shared<HeldCollectable>();
  std::weak_ptr<prometheus::Registry> registry = endpoint->registry_;
  std::weak_ptr<HeldCollectable> held = endpoint->held_;
  auto scrape = [registry, held]() {
    std::vector<prometheus::MetricFamily> families;
    if (auto r = registry.lock()) families = r->Collect();
    if (auto h = held.lock()) {
      for (auto& family : h->Collect()) families.push_back(std::move(family));
    }
    return prometheus::TextSerializer().Serialize(families);
  };
  absl::StatusOr<std::unique_ptr<ScrapeListener>> listener =
      ScrapeListener::Start(options.bind_address, options.password, std::move(scrape));
  if (!listener.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve Prometheus metrics (hooks.metrics_port): ", listener.status().message()));
  }
  endpoint->listener_ = *std::move(listener);
  endpoint->port_ = endpoint->listener_->port();
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() {
  listener_.reset();  // stops serving before what it serves goes
}

std::unique_ptr<WorkerMetrics> MetricsEndpoint::ForWorker(const std::string& task) {
  return std::make_unique<PrometheusWorkerMetrics>(*registry_, task);
}

std::unique_ptr<ServerMetrics> MetricsEndpoint::ForServer(const std::string& task,
                                                          std::function<void(int64_t*, int64_t*)> held) {
  held_->Add(task, std::move(held));
  return std::make_unique<ScrapedServerMetrics>(*registry_, task, held_);
}

}  // namespace shoal
