// Ways to run a whole job on this machine.
//
// TrainInProcess: every task (ps and workers) in this process, workers as
// threads, talking through the in-process transport; the embedded default of
// `shoal train`.
//
// TrainInLocalProcesses: every task its own process (`shoal server` and
// `shoal worker`), talking gRPC on loopback; what a real cluster does, on one
// machine. Each child sets its own compute threads (SetUpComputeThreads):
// the workers share the cores, a ps task takes one. A child that fails or hangs past the deadline fails
// the job, naming the task, and the others are stopped.
#ifndef SHOAL_SESSION_LOCAL_CLUSTER_H_
#define SHOAL_SESSION_LOCAL_CLUSTER_H_

#include <atomic>
#include <string>

#include "shoal/session/progress.h"
#include "shoal/session/worker_session.h"
#include "shoal/transport/inproc/inproc_transport.h"

namespace shoal {

// `progress` may be null. `customize`, if given, may adjust each worker's
// context before it starts (hooks; tests slow a worker down with it).
absl::StatusOr<TrainReport> TrainInProcess(const JobConfig& config, const InProcOptions& transport_options,
                                           std::FILE* progress,
                                           const std::function<void(WorkerContext&)>& customize = nullptr);

// `shoal_binary` is the path of the shoal executable to start the tasks with.
// Once `*signal` is set (a signal handler's), every task is sent SIGTERM: the
// job stops after its step in progress and reports. The tasks die with the
// launcher (PR_SET_PDEATHSIG), even if it is killed by SIGKILL.
absl::StatusOr<TrainReport> TrainInLocalProcesses(const JobConfig& config, const std::string& shoal_binary,
                                                  bool show_progress, const std::atomic<int>* signal = nullptr);

// What a local launch hands its task processes, in a fresh folder of its
// own (0700, /tmp/shoal-job-*): the cluster, the config and, unless the
// config brings a token, a fresh random token (token file, 0600), so that
// only this job's tasks can call each other.
struct LocalJobFiles {
  std::string dir, cluster_file, config_file, result_file;
};
absl::StatusOr<LocalJobFiles> WriteLocalJobFiles(JobConfig config, const ClusterSpec& cluster);

// `n` distinct loopback ports that are free now, below the kernel's
// ephemeral range where it can (so no bind to port 0 on the host takes one
// before the task binds it; an explicit bind still could).
absl::StatusOr<std::vector<int>> FreeLoopbackPorts(int n);

}  // namespace shoal

#endif  // SHOAL_SESSION_LOCAL_CLUSTER_H_
