#include "shoal/session/watching.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shoal/core/status.h"
#include "shoal/cluster/cluster_spec.h"
#include "shoal/telemetry/event_file.h"

namespace shoal {

std::string TraceFileOf(const std::string& trace, const std::string& process_tag) {
  if (process_tag.empty()) return trace;
  if (absl::EndsWith(trace, ".json")) return absl::StrCat(trace.substr(0, trace.size() - 5), ".", process_tag, ".json");
  return absl::StrCat(trace, ".", process_tag);
}

absl::StatusOr<std::unique_ptr<Watching>> Watching::Start(const JobConfig& config, const std::string& process_tag,
                                                         const std::string& address) {
  auto watching = std::make_unique<Watching>();
  const HooksConfig& hooks = config.hooks;
  if (hooks.metrics_port > 0) {
    MetricsEndpointOptions options;
    const bool open = !address.empty() && !IsLoopbackAddress(address) &&
                      (!config.security.token.empty() || config.security.insecure);
    options.bind_address = absl::StrCat(open ? "0.0.0.0" : "127.0.0.1", ":", hooks.metrics_port);
    if (open) options.password = config.security.token;
    SHOAL_ASSIGN_OR_RETURN(watching->endpoint_, MetricsEndpoint::Start(options));
  }
  if (!hooks.trace.empty()) {
    TraceOptions options;
    options.path = TraceFileOf(hooks.trace, process_tag);
    SHOAL_RETURN_IF_ERROR(ParseTraceSteps(hooks.trace_steps, &options));
    watching->tracer_ = std::make_unique<Tracer>(options);
  }
  return watching;
}

void Watching::WatchServer(VariableService& service, const TaskId& task) {
  if (empty()) return;
  const std::string name = absl::StrCat(task.job, ":", task.index);
  std::unique_ptr<ServerMetrics> metrics;
  if (endpoint_ != nullptr) {
    metrics = endpoint_->ForServer(name, [&service](int64_t* variables, int64_t* rows) {
      *variables = service.store().count();
      *rows = 0;
      for (const EmbeddingTable* table : service.tables().All()) *rows += table->size();
    });
  }
  // A training task serves too (a population's members, the gated
  // networks): its server's track is beside its steps'.
  const int track =
      tracer_ != nullptr ? tracer_->Track(task.job == "ps" ? name : absl::StrCat(name, " serving"), /*server=*/true)
                         : 0;
  service.Watch(std::move(metrics), tracer_.get(), track);
}

void Watching::WatchWorker(WorkerContext& context) {
  context.tracer = tracer_.get();
  context.metrics_endpoint = endpoint_.get();
}

absl::Status Watching::Finish() {
  if (tracer_ == nullptr) return absl::OkStatus();
  SHOAL_RETURN_IF_ERROR(tracer_->Write());
  absl::FPrintF(stderr, "trace: %s (open it in ui.perfetto.dev or chrome://tracing)\n", tracer_->path());
  return absl::OkStatus();
}

std::vector<std::pair<std::string, double>> EvaluationScalars(double accuracy, double loss,
                                                              std::optional<double> auc) {
  if (auc.has_value()) return {{"test/auc", *auc}, {"test/log_loss", loss}};
  return {{"test/accuracy", accuracy}, {"test/loss", loss}};
}

absl::Status WriteEvaluationEvents(const std::string& logdir, int64_t step,
                                   const std::vector<std::pair<std::string, double>>& scalars) {
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<EventFileWriter> writer, EventFileWriter::Create(logdir));
  SHOAL_RETURN_IF_ERROR(writer->AddScalars(step, scalars));
  return writer->Flush();
}

}  // namespace shoal
