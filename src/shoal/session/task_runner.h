// One task of a cluster, as `shoal server` and `shoal worker` run it, and the
// pieces every way of running a job shares.
#ifndef SHOAL_SESSION_TASK_RUNNER_H_
#define SHOAL_SESSION_TASK_RUNNER_H_

#include <atomic>
#include <memory>
#include <string>

#include "shoal/compute/compute_threads.h"
#include "shoal/session/watching.h"
#include "shoal/session/worker_session.h"
#include "shoal/transport/grpc/grpc_transport.h"

namespace shoal {

// The placement of the configured model's variables on `cluster`.
absl::StatusOr<std::shared_ptr<const Placement>> MakePlacement(const JobConfig& config, const ClusterSpec& cluster);

// A training task's client's deadlines: transport.rpc_timeout_s, and
// checkpoint.timeout_s for saves and restores.
ClientOptions ClientOptionsFor(const JobConfig& config);

// The server every task runs, with the job's message size limit;
// `is_job_peer` as in VariableServiceOptions.
std::unique_ptr<VariableService> MakeVariableService(const JobConfig& config, const TaskId& task,
                                                     std::function<bool(const std::string&)> is_job_peer = nullptr);

// A worker's context: its index among the training tasks, chief or not, and
// its shard of `train`.
WorkerContext MakeWorkerContext(const JobConfig& config, const ClusterSpec& cluster, const TaskId& task,
                                Client* client, const Dataset& train, int64_t max_steps);

// Sets this process's compute threads (BLAS and libtorch intra-op; see
// compute/compute_threads.h) for a task that trains or not, sharing its host
// with `training_tasks_on_host` training tasks, and warns once on a slow BLAS.
// Every entry point calls it before any compute: the in-process launcher,
// RunServerTask and RunWorkerTask.
ComputeThreads SetUpComputeThreads(const JobConfig& config, bool training_task, int training_tasks_on_host);

// Notes `threads` and the BLAS in `report`.
void DescribeCompute(const ComputeThreads& threads, TrainReport* report);

struct TaskOptions {
  std::string bind_address;                  // default: the task's address in the cluster
  // Set by a signal handler to the signal's number. A training task then
  // stops the job after its step in progress (the chief saves, evaluates and
  // shuts the ps down); a ps task keeps serving for that, until the chief
  // shuts it down or `grace_after_signal` has passed.
  const std::atomic<int>* signal = nullptr;
  absl::Duration grace_after_signal = absl::Seconds(20);
  // A training task's hooks beyond the config's (the public API's).
  std::vector<std::shared_ptr<TrainingHook>> extra_hooks;
};

// The gRPC options `config` asks for: message limit, connections, the
// token (read from security.token_file if need be), TLS.
absl::StatusOr<GrpcOptions> GrpcOptionsFor(const JobConfig& config);

// The transport `config` asks for (transport.kind): gRPC, or gRPC beside
// UCX for the tensors (FastPathTransport). `auto` falls back to gRPC under
// TLS, or when UCX cannot start (with a warning).
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const JobConfig& config);

// A task's server in this process (gRPC, and UCX beside it as
// transport.kind says); it serves until destroyed.
// Without a token it refuses an address beyond loopback (unless
// security.insecure) and takes shutdowns from the job's hosts only.
struct TaskServer {
  std::unique_ptr<Watching> watching;  // its metrics and trace, as the config asks
  std::unique_ptr<Transport> transport;
  std::unique_ptr<VariableService> service;
  std::unique_ptr<ServerHandle> server;  // declared last: stops first
};
absl::StatusOr<TaskServer> ServeTask(const JobConfig& config, const ClusterSpec& cluster, const TaskId& task,
                                     const TaskOptions& options);

// Serves `task`'s variables over gRPC until a Shutdown request or `stop`.
absl::Status RunServerTask(const JobConfig& config, const ClusterSpec& cluster, const TaskId& task,
                           const TaskOptions& options);

// The evaluator task: evaluates each new checkpoint under checkpoint.dir
// on the test set, writing a line to its metrics file (hooks.metrics_dir,
// evaluator_<i>.jsonl) and to stderr, until the chief ends the job (after
// its last checkpoint, which it evaluates too) or a signal.
absl::Status RunEvaluatorTask(const JobConfig& config, const ClusterSpec& cluster, const TaskId& task,
                              const TaskOptions& options);

// Runs a training task over gRPC: serves its own variables, trains, and on the
// chief evaluates and then shuts the ps tasks down. `report` is filled on the
// chief. `progress` may be null.
absl::Status RunWorkerTask(const JobConfig& config, const ClusterSpec& cluster, const TaskId& task,
                           const TaskOptions& options, std::FILE* progress, TrainReport* report);

}  // namespace shoal

#endif  // SHOAL_SESSION_TASK_RUNNER_H_
