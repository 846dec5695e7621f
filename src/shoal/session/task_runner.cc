#include "shoal/session/task_runner.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/core/file.h"
#include "shoal/hooks/watch_hooks.h"
#include "shoal/core/status.h"
#include "shoal/hooks/standard_hooks.h"
#include "shoal/session/evaluator.h"
#include "shoal/session/progress.h"
#include "shoal/strategy/leased_data.h"
#include "shoal/strategy/training_mode.h"
#include "shoal/transport/fast_path_transport.h"
#include "shoal/transport/grpc/grpc_transport.h"
#include "shoal/transport/ucx/ucx_transport.h"

namespace shoal {

absl::StatusOr<GrpcOptions> GrpcOptionsFor(const JobConfig& config) {
  GrpcOptions options;
  options.max_message_bytes = static_cast<size_t>(config.transport.max_message_mb) << 20;
  options.connections_per_peer = config.transport.connections_per_peer;
  const SecurityConfig& security = config.security;
  options.token = security.token;
  if (options.token.empty() && !security.token_file.empty()) {
    SHOAL_ASSIGN_OR_RETURN(std::string text, ReadTextFile(security.token_file, "token file"));
    options.token = std::string(absl::StripAsciiWhitespace(text));
    if (options.token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("token file '", security.token_file, "' is empty"));
    }
  }
  options.tls = GrpcTlsOptions{security.tls_ca_file, security.tls_cert_file, security.tls_key_file,
                               security.mutual_tls};
  return options;
}

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const JobConfig& config) {
  SHOAL_ASSIGN_OR_RETURN(GrpcOptions grpc_options, GrpcOptionsFor(config));
  auto grpc = std::make_unique<GrpcTransport>(grpc_options);
  const std::string& kind = config.transport.kind;
  // UCX has no encryption: under TLS, `auto` keeps everything on gRPC (the
  // config check refuses `ucx` with TLS).
  if (kind == "grpc" || (kind == "auto" && grpc_options.tls.enabled())) return std::unique_ptr<Transport>(std::move(grpc));
  UcxOptions ucx_options;
  ucx_options.max_message_bytes = grpc_options.max_message_bytes;
  ucx_options.token = grpc_options.token;
  ucx_options.connections_per_peer = config.transport.connections_per_peer;
  ucx_options.connect_timeout = absl::Seconds(std::min(10.0, config.transport.rpc_timeout_s));
  absl::StatusOr<std::unique_ptr<UcxTransport>> ucx = UcxTransport::Create(ucx_options);
  if (!ucx.ok()) {
    if (kind == "ucx") return ucx.status();
    static std::once_flag warned;
    std::call_once(warned, [&] {
      absl::FPrintF(stderr, "shoal: UCX cannot start (%s); tensors go over gRPC\n", ucx.status().ToString());
    });
    return std::unique_ptr<Transport>(std::move(grpc));
  }
  // `auto` moves a channel to gRPC while gRPC carries more (a busy
  // machine); `ucx` keeps every call on UCX.
  return std::unique_ptr<Transport>(
      std::make_unique<FastPathTransport>(std::move(grpc), *std::move(ucx), "ucx", /*try_routes=*/kind == "auto"));
}

namespace {

// Starts `task`'s own server; every task hosts one.
absl::Status Serve(const JobConfig& config, const ClusterSpec& cluster, const TaskId& task,
                   const TaskOptions& options, Transport& transport, Watching& watching,
                   std::unique_ptr<VariableService>* service, std::unique_ptr<ServerHandle>* server,
                   bool has_token) {
  SHOAL_ASSIGN_OR_RETURN(std::string address, cluster.AddressOf(task));
  if (!options.bind_address.empty()) address = options.bind_address;
  // TensorFlow's servers answered anyone who reached their port; shoal's
  // do so only on loopback, or when the config says so in as many words.
  if (!has_token && !config.security.insecure && !IsLoopbackAddress(address)) {
    return absl::FailedPreconditionError(absl::StrCat(
        task.ToString(), " would listen on ", address,
        " without a token: anyone who reaches that port could overwrite the model, write checkpoints and stop the "
        "job. Give every task the same token (security.token_file, or SHOAL_TOKEN in the environment), or set "
        "security.insecure: true to accept that"));
  }
  // Without a token, only the job's own hosts may end it with a shutdown.
  std::function<bool(const std::string&)> is_job_peer;
  if (!has_token) is_job_peer = [cluster](const std::string& peer) { return IsPeerOfJob(peer, cluster); };
  *service = MakeVariableService(config, task, std::move(is_job_peer));
  watching.WatchServer(**service, task);
  SHOAL_ASSIGN_OR_RETURN(*server, transport.Serve(address, service->get()));
  return absl::OkStatus();
}

// A job on leased data ends when the lease table has finished its epochs
// (the steps that takes depend on who trained), unless training.max_steps
// ends it first.
bool EndsWithItsData(const JobConfig& config) { return config.data.leases && config.training.max_steps == 0; }

}  // namespace

ComputeThreads SetUpComputeThreads(const JobConfig& config, bool training_task, int training_tasks_on_host) {
  // OPENBLAS_NUM_THREADS is read because OpenBLAS itself honours it: a user
  // who set it keeps it.
  const ComputeThreads threads = ChooseComputeThreads(config.cluster.threads_per_task, std::getenv("OPENBLAS_NUM_THREADS"),
                                                      training_task, training_tasks_on_host, UsableCores());
  SetComputeThreads(threads.threads);
  WarnOnceIfBlasIsSlow();
  return threads;
}

void DescribeCompute(const ComputeThreads& threads, TrainReport* report) {
  report->compute_threads = threads.threads;
  report->compute_threads_source = threads.source;
  report->intra_op_threads = IntraOpThreadsBeside(threads.threads);
  report->blas = IdentifyBlas().name;
}

std::unique_ptr<VariableService> MakeVariableService(const JobConfig& config, const TaskId& task,
                                                     std::function<bool(const std::string&)> is_job_peer) {
  return std::make_unique<VariableService>(VariableServiceOptions{task.ToString(),
                                                                  static_cast<size_t>(config.transport.max_message_mb)
                                                                      << 20,
                                                                  config.checkpoint.dir, std::move(is_job_peer)});
}

ClientOptions ClientOptionsFor(const JobConfig& config) {
  return ClientOptions{absl::Seconds(config.transport.rpc_timeout_s), absl::Seconds(config.checkpoint.timeout_s)};
}

absl::StatusOr<std::shared_ptr<const Placement>> MakePlacement(const JobConfig& config, const ClusterSpec& cluster) {
  SHOAL_ASSIGN_OR_RETURN(const TrainingMode* mode, FindMode(config.training.mode));
  const std::vector<TaskId> workers = cluster.TrainingTasks();
  SHOAL_ASSIGN_OR_RETURN(std::vector<VariableSpec> specs, mode->Variables(config, static_cast<int>(workers.size())));
  PlacementOptions options = config.placement;
  for (const ScopeRule& rule : mode->ScopeRules(config, workers, cluster.Chief())) options.scope_rules.push_back(rule);
  SHOAL_ASSIGN_OR_RETURN(Placement placement, Placement::Create(specs, cluster, options));
  return std::make_shared<const Placement>(std::move(placement));
}

WorkerContext MakeWorkerContext(const JobConfig& config, const ClusterSpec& cluster, const TaskId& task,
                                Client* client, const Dataset& train, int64_t max_steps) {
  const std::vector<TaskId> workers = cluster.TrainingTasks();
  WorkerContext context;
  context.task = task;
  context.worker_index = static_cast<int>(std::find(workers.begin(), workers.end(), task) - workers.begin());
  context.num_workers = static_cast<int>(workers.size());
  context.workers = workers;
  context.is_chief = cluster.IsChief(task);
  context.client = client;
  context.config = &config;
  context.train_examples = train.size();
  context.data_fingerprint = DataFingerprint(train);
  if (config.data.leases) {
    context.leases.enabled = true;
    context.leases.shard_examples =
        LeaseShardExamples(config.data.lease_shard_examples, train.size(), config.training.batch_size);
    context.leases.timeout = absl::Seconds(config.data.lease_timeout_s);
    context.train_set = train;
  }
  // The mode's share of the training set (mode names are checked before any
  // task starts); a worker that joined leases all of it.
  if (context.worker_index < context.num_workers) {
    FindMode(config.training.mode).value()->SplitData(config, train, context);
  } else {
    context.worker_index = context.num_workers + task.index;  // counted after the listed workers
  }
  context.max_steps = max_steps;
  if (EndsWithItsData(config)) {
    context.leases.epochs = config.training.epochs;
    context.max_steps = kNoStepLimit;
  }
  return context;
}

absl::Status RunEvaluatorTask(const JobConfig& config, const ClusterSpec& cluster, const TaskId& task,
                              const TaskOptions& options) {
  SHOAL_RETURN_IF_ERROR(Annotate(CheckEvaluatorConfig(config), task.ToString()));
  SetUpComputeThreads(config, /*training_task=*/false, cluster.TrainingTasksOnHostOf(task));
  SHOAL_ASSIGN_OR_RETURN(DataSplits data, LoadData(config));
  SHOAL_ASSIGN_OR_RETURN(GrpcOptions grpc_options, GrpcOptionsFor(config));
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Transport> transport, MakeTransport(config));
  std::unique_ptr<VariableService> service;  // holds nothing; the chief ends the job through it
  std::unique_ptr<ServerHandle> server;
  // An evaluator the cluster does not list (the training operator's) has no
  // address: it serves nothing, and is done a second after it has evaluated
  // the job's last step, or when it is told to stop.
  const bool listed = cluster.AddressOf(task).ok();
  Watching unwatched;  // its server serves only the chief's shutdown
  if (listed) {
    SHOAL_RETURN_IF_ERROR(Serve(config, cluster, task, options, *transport, unwatched, &service, &server,
                                !grpc_options.token.empty()));
  }
  // The job's last step, which an unlisted evaluator stops at; a job that
  // ends with its data ends at the checkpoint whose lease table has
  // finished its epochs.
  const int64_t last_step = MaxSteps(config, data.train.size(), static_cast<int>(cluster.TrainingTasks().size()));
  bool evaluated_last = false;
  std::ofstream metrics;
  if (!config.hooks.metrics_dir.empty()) {
    std::filesystem::create_directories(config.hooks.metrics_dir);
    const auto path = std::filesystem::path(config.hooks.metrics_dir) / MetricsFileName(task.job, task.index, "jsonl");
    metrics.open(path, std::ios::app);
    if (!metrics) return absl::InternalError(absl::StrCat(task.ToString(), " cannot write ", path.string()));
  }
  std::unique_ptr<EventFileWriter> events;  // TensorBoard's, in hooks.logdir/evaluator_<i>
  if (!config.hooks.logdir.empty()) {
    SHOAL_ASSIGN_OR_RETURN(events, EventFileWriter::Create(EventFolderOf(config.hooks.logdir, task.job, task.index)));
  }
  const bool fall_back = config.checkpoint.on_corrupt == "fall_back";
  int64_t evaluated_step = -1;
  while (true) {
    // Once the chief has ended the job (its last checkpoint saved), or an
    // unlisted evaluator has seen the last step, one more look, for the
    // final checkpoint, and the evaluator is done.
    const bool ending = (listed && service->shutdown_requested().HasBeenNotified()) ||
                        (!listed && evaluated_last) ||
                        (options.signal != nullptr && options.signal->load() != 0);
    absl::StatusOr<std::string> latest = LatestCheckpoint(config.checkpoint.dir, fall_back);
    if (!latest.ok() && !absl::IsNotFound(latest.status())) return Annotate(latest.status(), task.ToString());
    if (latest.ok()) {
      SHOAL_ASSIGN_OR_RETURN(CheckpointIndex index, ReadCheckpointIndex(*latest));
      if (index.step > evaluated_step) {
        SHOAL_ASSIGN_OR_RETURN(CheckpointEvaluation evaluation, EvaluateCheckpoint(config, *latest, data.test));
        evaluated_step = evaluation.global_step;
        evaluated_last = EndsWithItsData(config) ? index.lease_table.has_value() &&
                                              index.lease_table->epochs_done() >= config.training.epochs
                                        : evaluated_step >= last_step;
        absl::FPrintF(stderr, "%s: %s (global step %d): test accuracy %.2f%%, loss %.4f%s\n", task.ToString(),
                      evaluation.checkpoint, evaluation.global_step, 100 * evaluation.test_accuracy,
                      evaluation.test_loss,
                      evaluation.test_auc ? absl::StrFormat(", AUC %.4f", *evaluation.test_auc) : "");
        if (metrics.is_open()) metrics << EvaluationJsonLine(task.ToString(), evaluation) << std::endl;
        if (events != nullptr) {
          SHOAL_RETURN_IF_ERROR(events->AddScalars(
              evaluation.global_step,
              EvaluationScalars(evaluation.test_accuracy, evaluation.test_loss, evaluation.test_auc)));
          SHOAL_RETURN_IF_ERROR(events->Flush());
        }
      }
    }
    if (ending) return absl::OkStatus();
    if (listed) {
      service->shutdown_requested().WaitForNotificationWithTimeout(absl::Seconds(1));
    } else {
      absl::SleepFor(absl::Seconds(1));
    }
  }
}

absl::StatusOr<TaskServer> ServeTask(const JobConfig& config, const ClusterSpec& cluster, const TaskId& task,
                                     const TaskOptions& options) {
  SHOAL_ASSIGN_OR_RETURN(GrpcOptions grpc_options, GrpcOptionsFor(config));
  TaskServer served;
  SHOAL_ASSIGN_OR_RETURN(const std::string address, cluster.AddressOf(task));
  SHOAL_ASSIGN_OR_RETURN(served.watching, Watching::Start(config, absl::StrCat(task.job, "_", task.index), address));
  SHOAL_ASSIGN_OR_RETURN(served.transport, MakeTransport(config));
  SHOAL_RETURN_IF_ERROR(Serve(config, cluster, task, options, *served.transport, *served.watching, &served.service,
                              &served.server, !grpc_options.token.empty()));
  return served;
}

absl::Status RunServerTask(const JobConfig& config, const ClusterSpec& cluster, const TaskId& task,
                           const TaskOptions& options) {
  SetUpComputeThreads(config, /*training_task=*/false, cluster.TrainingTasksOnHostOf(task));
  SHOAL_ASSIGN_OR_RETURN(TaskServer served, ServeTask(config, cluster, task, options));
  VariableService* service = served.service.get();
  absl::Time give_up = absl::InfiniteFuture();
  while (!service->shutdown_requested().WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    if (options.signal != nullptr && options.signal->load() != 0 && give_up == absl::InfiniteFuture()) {
      give_up = absl::Now() + options.grace_after_signal;  // the chief still needs us for its last save
    }
    if (absl::Now() >= give_up) break;
  }
  return served.watching->Finish();
}

absl::Status RunWorkerTask(const JobConfig& config, const ClusterSpec& cluster, const TaskId& task,
                           const TaskOptions& options, std::FILE* progress_out, TrainReport* report) {
  const absl::Time started = absl::Now();
  const std::vector<TaskId> workers = cluster.TrainingTasks();
  // On leased data a worker the cluster does not list joins the running job
  // (elastic workers): it takes leases like any other, and serves nothing.
  const bool listed = std::find(workers.begin(), workers.end(), task) != workers.end();
  if (!listed && !(config.data.leases && task.job == "worker")) {
    return absl::InvalidArgumentError(absl::StrCat(task.ToString(),
                                                   " is not a training task (chief or worker) of the cluster; with "
                                                   "data.leases a worker the cluster does not list joins the job"));
  }
  const ComputeThreads threads = SetUpComputeThreads(config, /*training_task=*/true, cluster.TrainingTasksOnHostOf(task));
  SHOAL_ASSIGN_OR_RETURN(DataSplits data, LoadData(config));
  SHOAL_ASSIGN_OR_RETURN(GrpcOptions grpc_options, GrpcOptionsFor(config));
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Transport> transport, MakeTransport(config));
  std::string address;
  if (listed) {
    SHOAL_ASSIGN_OR_RETURN(address, cluster.AddressOf(task));
  }
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Watching> watching,
                         Watching::Start(config, absl::StrCat(task.job, "_", task.index), address));
  std::unique_ptr<VariableService> service;
  std::unique_ptr<ServerHandle> server;
  if (listed) {
    SHOAL_RETURN_IF_ERROR(Serve(config, cluster, task, options, *transport, *watching, &service, &server,
                                !grpc_options.token.empty()));
  }
  SHOAL_ASSIGN_OR_RETURN(auto placement, MakePlacement(config, cluster));
  SHOAL_ASSIGN_OR_RETURN(auto client,
                         Client::Create(cluster, transport.get(), placement, ClientOptionsFor(config)));
  const int64_t max_steps = MaxSteps(config, data.train.size(), static_cast<int>(cluster.TrainingTasks().size()));
  WorkerContext context = MakeWorkerContext(config, cluster, task, client.get(), data.train, max_steps);
  context.started = started;
  watching->WatchWorker(context);
  // SIGTERM stops the job, but on leased data a worker other than the chief
  // leaves it alone (a scaled-down pod), and the others train on.
  if (config.data.leases && !context.is_chief) {
    context.leave_requested = options.signal;
  } else if (options.signal != nullptr) {
    context.extra_hooks.push_back(std::make_shared<StopOnSignalHook>(options.signal));
  }
  for (const auto& hook : options.extra_hooks) context.extra_hooks.push_back(hook);
  std::unique_ptr<ProgressReporter> progress;
  if (progress_out && context.is_chief) {
    progress = std::make_unique<ProgressReporter>(
        progress_out, max_steps, ExamplesPerStep(config, static_cast<int>(cluster.TrainingTasks().size())));
    context.on_step = [&](int64_t step, double loss, double auc) { progress->OnStep(step, loss, auc); };
  }
  absl::Status status = RunWorkerSession(context, config.hooks, data.test, report);
  if (progress) progress->Finish();
  if (absl::Status written = watching->Finish(); !written.ok()) {
    absl::FPrintF(stderr, "%s: the trace was not written: %s\n", task.ToString(), written.message());
  }
  if (report) DescribeCompute(threads, report);
  // A population member's variables may live on its own task: it serves them
  // until the chief has read every member for the report.
  const bool serves_members = FindMode(config.training.mode).value()->WorkersHostVariables();
  if (context.is_chief) {
    // The job is over (or failed): the other tasks have nothing left to
    // serve. A task already gone is not waited for beyond a short deadline.
    std::unique_ptr<Client> closing = client->WithTimeout(absl::Seconds(2));
    for (const TaskId& ps : cluster.Tasks("ps")) closing->Shutdown(ps).IgnoreError();
    for (const TaskId& evaluator : cluster.Tasks("evaluator")) closing->Shutdown(evaluator).IgnoreError();
    if (serves_members) {
      for (const TaskId& worker : workers) {
        if (worker != task) closing->Shutdown(worker).IgnoreError();
      }
    }
  } else if (serves_members && status.ok()) {
    const absl::Duration wait = absl::Seconds(config.transport.rpc_timeout_s);
    if (!service->shutdown_requested().WaitForNotificationWithTimeout(wait)) {
      absl::FPrintF(stderr, "%s: the chief did not end the job within %s after training; leaving\n",
                    task.ToString(), absl::FormatDuration(wait));
    }
  }
  return status;
}

}  // namespace shoal
