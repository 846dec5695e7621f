#include "shoal/session/worker_session.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shoal/checkpoint/saver_hook.h"
#include "shoal/core/status.h"
#include "shoal/hooks/standard_hooks.h"
#include "shoal/hooks/watch_hooks.h"
#include "shoal/session/run_folder.h"
#include "shoal/session/watching.h"
#include "shoal/strategy/leased_data.h"
#include "shoal/strategy/training_mode.h"
#include "shoal/telemetry/phase.h"

namespace shoal {

namespace {

// Job-wide sums each worker adds to when it is done.
constexpr char kBytesSent[] = "bytes_sent";
constexpr char kBytesReceived[] = "bytes_received";
constexpr char kTensorBytesSent[] = "tensor_bytes_sent";
constexpr char kWorkerSteps[] = "worker_steps";
constexpr char kCallsRetried[] = "calls_retried";
constexpr char kRowCacheLookups[] = "row_cache_lookups";
constexpr char kRowCacheHits[] = "row_cache_hits";

// The job's counters a checkpoint keeps, for a counter task that is lost
// (global_step is the checkpoint's own step).
std::vector<std::string> SavedCounters(const TrainingMode& mode, const WorkerContext& context) {
  std::vector<std::string> counters = {kStopRequested, kWorkersDone,     kStaleGradients, kRestores,
                                       kBytesSent,     kBytesReceived,   kTensorBytesSent, kWorkerSteps,
                                       kCallsRetried,  kDataFingerprint, kDataStartStep};
  for (std::string& own : mode.SavedCounters(*context.config, context.num_workers)) {
    counters.push_back(std::move(own));
  }
  if (mode.KeepsDataPosition()) {
    for (int w = 0; w < context.num_workers; ++w) counters.push_back(DataPositionCounter(w, context.num_workers));
  }
  return counters;
}

// A worker's steps and time by phase (in microseconds), kept on the counter
// task for the chief's summary (they only add: a restarted worker adds on).
std::string TaskTimeCounter(int worker_index, const char* what) {
  return absl::StrCat("task_time/", worker_index, "/", what);
}
constexpr const char* kTimeParts[] = {"steps", "seconds_us", "compute_us", "communication_us", "waiting_us",
                                      "checkpoint_us"};

absl::Status PublishTaskTime(Client& client, int worker_index, const PhaseRecorder& phases, int64_t steps) {
  auto micros = [](double seconds) { return static_cast<int64_t>(seconds * 1e6); };
  const int64_t values[] = {steps,
                            micros(phases.elapsed_seconds()),
                            micros(phases.seconds(Phase::kCompute)),
                            micros(phases.seconds(Phase::kPull) + phases.seconds(Phase::kPush)),
                            micros(phases.seconds(Phase::kWait)),
                            micros(phases.seconds(Phase::kCheckpoint))};
  for (size_t i = 0; i < std::size(kTimeParts); ++i) {
    SHOAL_RETURN_IF_ERROR(client.AddToCounter(TaskTimeCounter(worker_index, kTimeParts[i]), values[i]).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<TaskTime> ReadTaskTime(Client& client, int worker_index) {
  int64_t values[std::size(kTimeParts)];
  for (size_t i = 0; i < std::size(kTimeParts); ++i) {
    SHOAL_ASSIGN_OR_RETURN(values[i], client.AddToCounter(TaskTimeCounter(worker_index, kTimeParts[i]), 0));
  }
  TaskTime time;
  time.steps = values[0];
  time.seconds = values[1] / 1e6;
  time.compute = values[2] / 1e6;
  time.communication = values[3] / 1e6;
  time.waiting = values[4] / 1e6;
  time.checkpoint = values[5] / 1e6;
  return time;
}

}  // namespace

absl::StatusOr<DataSplits> LoadData(const JobConfig& config) {
  DataSplits splits;
  const std::unique_ptr<DataSource> source = MakeDataSource(config.data);
  SHOAL_ASSIGN_OR_RETURN(splits.train, source->Load(/*train=*/true));
  SHOAL_ASSIGN_OR_RETURN(splits.test, source->Load(/*train=*/false));
  auto limit = [](Dataset& d, int64_t n) {
    if (n > 0 && n < d.size()) d = Dataset{d.images.narrow(0, 0, n), d.labels.narrow(0, 0, n)};
  };
  limit(splits.train, config.data.train_examples);
  limit(splits.test, config.data.test_examples);
  return splits;
}

absl::Status RunWorkerSession(WorkerContext& context, const HooksConfig& hooks_config, const Dataset& test_set,
                              TrainReport* report) {
  const absl::Time start = absl::Now();
  SHOAL_ASSIGN_OR_RETURN(const TrainingMode* mode, FindMode(context.config->training.mode));
  const std::unique_ptr<TrainingStrategy> strategy = mode->MakeStrategy();
  // The chief notes when the job is past its warm-up, for the steady rate.
  int64_t warm_step = -1;
  absl::Time warm_time;
  if (context.is_chief) {
    StepCallback report_step = context.on_step;
    context.on_step = [&, report_step](int64_t step, double loss, double auc) {
      if (warm_step < 0 && step >= context.restored_step + kWarmupSteps) {
        warm_step = step;
        warm_time = absl::Now();
      }
      if (report_step) report_step(step, loss, auc);
    };
  }
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<HookList> hooks,
                         MakeStandardHooks(hooks_config, context.task.job, context.task.index));
  std::shared_ptr<CheckpointSaverHook> saver;
  if (context.is_chief && !context.config->checkpoint.dir.empty()) {
    const std::string& background = context.config->checkpoint.background;
    saver = std::make_shared<CheckpointSaverHook>(
        context.client, context.config->checkpoint, SavedCounters(*mode, context),
        background == "true" || (background == "auto" && !mode->CheckpointsHoldOneStep()));
    hooks->Add(saver);
  }
  for (const auto& hook : context.extra_hooks) hooks->Add(hook);
  // Where the time goes (the summary), and the trace and Prometheus when on.
  const std::string task_name = absl::StrCat(context.task.job, ":", context.task.index);
  std::unique_ptr<WorkerMetrics> worker_metrics;
  PhaseObserver observe_phase;
  if (context.metrics_endpoint != nullptr) {
    worker_metrics = context.metrics_endpoint->ForWorker(task_name);
    hooks->Add(std::make_shared<PrometheusHook>(worker_metrics.get()));
    observe_phase = [metrics = worker_metrics.get()](Phase phase, double seconds) { metrics->PhaseDone(phase, seconds); };
  }
  PhaseRecorder phases(context.tracer, context.tracer != nullptr ? context.tracer->Track(task_name, false) : 0,
                       std::move(observe_phase));
  context.hooks = hooks.get();
  absl::StatusOr<WorkerResult> worker;
  {
    PhaseRecorder::Installed installed(&phases);
    worker = strategy->RunWorker(context);
  }
  hooks->End(worker.status());
  context.hooks = nullptr;
  const absl::Time trained = absl::Now();
  if (!worker.ok()) return Annotate(worker.status(), context.task.ToString());
  if (!worker->stop_reason.empty()) {
    absl::FPrintF(stderr, "%s stopped the job: %s\n", context.task.ToString(), worker->stop_reason);
  }
  Client& client = *context.client;
  SHOAL_RETURN_IF_ERROR(client.AddToCounter(kBytesSent, client.bytes_sent() - context.startup_bytes_sent).status());
  SHOAL_RETURN_IF_ERROR(
      client.AddToCounter(kBytesReceived, client.bytes_received() - context.startup_bytes_received).status());
  SHOAL_RETURN_IF_ERROR(
      client.AddToCounter(kTensorBytesSent, client.tensor_bytes_sent() - context.startup_tensor_bytes_sent).status());
  SHOAL_RETURN_IF_ERROR(client.AddToCounter(kWorkerSteps, worker->local_steps).status());
  SHOAL_RETURN_IF_ERROR(client.AddToCounter(kCallsRetried, client.retries()).status());
  SHOAL_RETURN_IF_ERROR(client.AddToCounter(kRowCacheLookups, worker->row_cache.lookups).status());
  SHOAL_RETURN_IF_ERROR(client.AddToCounter(kRowCacheHits, worker->row_cache.hits).status());
  SHOAL_RETURN_IF_ERROR(PublishTaskTime(client, context.worker_index, phases, worker->local_steps));
  SHOAL_RETURN_IF_ERROR(client.AddToCounter(kWorkersDone, 1).status());
  // Leased data: the shard held goes back for others, and this worker
  // leaves the job's members the chief waits on, its last word to the job.
  if (context.leased_data != nullptr) SHOAL_RETURN_IF_ERROR(context.leased_data->Leave().status());
  if (!context.is_chief) return absl::OkStatus();

  // The chief evaluates once every worker has pushed its last step. A
  // worker that died (a killed backup in sync mode, a crashed one in async)
  // never will: after the RPC deadline the chief evaluates what the ps hold
  // and says so, rather than failing a job whose steps are all done.
  // On leased data the lease table knows who is still in the job (workers
  // that joined, and those waiting for a shard or told the data is over,
  // too); one that died drops out of it after the lease timeout.
  const absl::Time give_up = absl::Now() + absl::Seconds(context.config->transport.rpc_timeout_s);
  while (true) {
    SHOAL_ASSIGN_OR_RETURN(int64_t done, context.client->AddToCounter(kWorkersDone, 0));
    if (context.leased_data != nullptr) {
      SHOAL_ASSIGN_OR_RETURN(const int64_t members, context.leased_data->Leave());
      if (members == 0) break;
    } else if (done >= context.num_workers) {
      break;
    }
    if (absl::Now() > give_up) {
      report->unfinished_workers = static_cast<int>(std::max<int64_t>(0, context.num_workers - done));
      absl::FPrintF(stderr, "%s: %d of %d workers did not finish within %s s; evaluating without them\n",
                    context.task.ToString(), report->unfinished_workers, context.num_workers,
                    absl::StrCat(context.config->transport.rpc_timeout_s));
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  report->seconds = absl::ToDoubleSeconds(absl::Now() - start);
  SHOAL_ASSIGN_OR_RETURN(report->global_step, context.client->AddToCounter(kGlobalStep, 0));
  report->restored_from = context.restored_from;
  report->recoveries = context.recoveries;
  SHOAL_ASSIGN_OR_RETURN(report->restores, context.client->AddToCounter(kRestores, 0));
  if (saver != nullptr) {
    report->checkpoints_saved = saver->saved();
    report->checkpoint_seconds = saver->seconds_waited();
    report->checkpoint_save_seconds = saver->seconds_saving();
    report->checkpoints_in_background = saver->background();
  }
  if (!context.config->checkpoint.dir.empty()) {
    SHOAL_ASSIGN_OR_RETURN(report->last_checkpoint,
                           SaveAndPrune(*context.client, context.config->checkpoint, report->global_step,
                                        SavedCounters(*mode, context)));
  }
  if (context.leases.enabled) {
    SHOAL_ASSIGN_OR_RETURN(report->data_ledger, CheckJobLedgers(client, context.train_set.size()));
    report->data_ledger.leases_taken = worker->leases_taken;
  }
  SHOAL_ASSIGN_OR_RETURN(report->stale_gradients_dropped, context.client->AddToCounter(kStaleGradients, 0));
  SHOAL_ASSIGN_OR_RETURN(report->bytes_sent, context.client->AddToCounter(kBytesSent, 0));
  SHOAL_ASSIGN_OR_RETURN(report->bytes_received, context.client->AddToCounter(kBytesReceived, 0));
  SHOAL_ASSIGN_OR_RETURN(report->tensor_bytes_sent, context.client->AddToCounter(kTensorBytesSent, 0));
  SHOAL_ASSIGN_OR_RETURN(report->worker_steps, context.client->AddToCounter(kWorkerSteps, 0));
  SHOAL_ASSIGN_OR_RETURN(report->calls_retried, context.client->AddToCounter(kCallsRetried, 0));
  SHOAL_ASSIGN_OR_RETURN(const int64_t cache_lookups, context.client->AddToCounter(kRowCacheLookups, 0));
  SHOAL_ASSIGN_OR_RETURN(const int64_t cache_hits, context.client->AddToCounter(kRowCacheHits, 0));
  if (cache_lookups > 0) report->row_cache_hit_rate = static_cast<double>(cache_hits) / cache_lookups;
  for (const std::string& table : worker->tables) {
    SHOAL_ASSIGN_OR_RETURN(const Client::TableOccupancy occupancy, context.client->Occupancy(table));
    report->table_rows_held += occupancy.rows_held;
    report->table_ids_refused += occupancy.ids_refused;
    report->table_rows_evicted += occupancy.rows_evicted;
  }
  SHOAL_ASSIGN_OR_RETURN(bool stopped, JobStopRequested(*context.client));
  if (stopped) {
    // Another worker's hook stopped the job; at stop_at_step that is the
    // step's hook, which every worker runs.
    const int64_t stop_at = hooks_config.stop_at_step;
    report->stop_reason = !worker->stop_reason.empty() ? worker->stop_reason
                          : stop_at > 0 && report->global_step >= stop_at
                              ? StopAtStepHook::Reason(stop_at)
                              : "a worker's hook stopped the job";
  }
  const int64_t examples_per_step = ExamplesPerStep(*context.config, context.num_workers);
  const int64_t trained_steps = report->global_step - context.restored_step;  // in this session
  report->examples_per_second = trained_steps * examples_per_step / report->seconds;
  if (context.train_examples > 0) {
    report->epochs_trained = static_cast<double>(trained_steps * examples_per_step) / context.train_examples;
  }
  report->steady_examples_per_second = report->examples_per_second;
  if (warm_step >= 0 && trained > warm_time && report->global_step > warm_step) {
    report->steady_examples_per_second =
        (report->global_step - warm_step) * examples_per_step / absl::ToDoubleSeconds(trained - warm_time);
  }
  report->last_loss = worker->last_loss;
  for (int w = 0; w < context.num_workers; ++w) {
    SHOAL_ASSIGN_OR_RETURN(TaskTime time, ReadTaskTime(client, w));
    if (time.seconds > 0) {
      time.task = absl::StrCat(context.workers[w].job, ":", context.workers[w].index);
      report->task_times.push_back(std::move(time));
    }
  }
  SHOAL_RETURN_IF_ERROR(mode->Report(context, test_set, report));
  if (!hooks_config.logdir.empty()) {
    const auto evaluation =
        EvaluationScalars(report->test_accuracy, report->test_loss,
                          report->test_auc > 0 ? std::optional<double>(report->test_auc) : std::nullopt);
    if (absl::Status written = WriteEvaluationEvents(hooks_config.logdir, report->global_step, evaluation);
        !written.ok()) {
      absl::FPrintF(stderr, "%s: the evaluation is not in TensorBoard's files: %s\n", context.task.ToString(),
                    written.message());
    }
  }
  // The trained model leaves with the report: the ps's values, which the
  // caller loads into its own module, and the run folder's files.
  SHOAL_ASSIGN_OR_RETURN(
      FinalModel final_model,
      mode->Final(*context.config, context.num_workers,
                  [&client](const std::vector<std::string>& names) { return client.Read(names); }, /*member=*/-1));
  KeepTrainedModel(hooks_config, std::move(final_model), report);
  return absl::OkStatus();
}

}  // namespace shoal
