#include "shoal/session/local_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "shoal/core/file.h"
#include "shoal/core/status.h"
#include "shoal/export/model_files.h"
#include "shoal/session/run_folder.h"
#include "shoal/session/task_runner.h"
#include "shoal/session/watching.h"
#include "shoal/strategy/training_mode.h"

namespace shoal {

absl::StatusOr<TrainReport> TrainInProcess(const JobConfig& config, const InProcOptions& transport_options,
                                           std::FILE* progress_out,
                                           const std::function<void(WorkerContext&)>& customize) {
  SHOAL_RETURN_IF_ERROR(ValidateJobConfig(config));
  const ClusterSpec cluster = ClusterSpec::Local(config.cluster.ps, config.cluster.workers);
  // Every worker computes in this process; the ps tasks' work runs on their
  // calling threads.
  const ComputeThreads threads =
      SetUpComputeThreads(config, /*training_task=*/true, static_cast<int>(cluster.TrainingTasks().size()));
  SHOAL_ASSIGN_OR_RETURN(DataSplits data, LoadData(config));
  InProcNetwork network;
  InProcTransport transport(&network, transport_options);
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Watching> watching, Watching::Start(config, /*process_tag=*/""));

  // Every task runs a server, workers included (later modes host variables there).
  std::vector<std::unique_ptr<VariableService>> services;
  std::vector<std::unique_ptr<ServerHandle>> servers;
  for (const TaskId& task : cluster.AllTasks()) {
    services.push_back(MakeVariableService(config, task));
    watching->WatchServer(*services.back(), task);
    SHOAL_ASSIGN_OR_RETURN(std::string address, cluster.AddressOf(task));
    SHOAL_ASSIGN_OR_RETURN(auto server, transport.Serve(address, services.back().get()));
    servers.push_back(std::move(server));
  }
  SHOAL_ASSIGN_OR_RETURN(auto placement, MakePlacement(config, cluster));

  const std::vector<TaskId> workers = cluster.TrainingTasks();
  const int64_t max_steps = MaxSteps(config, data.train.size(), static_cast<int>(cluster.TrainingTasks().size()));
  std::unique_ptr<ProgressReporter> progress;
  if (progress_out) progress = std::make_unique<ProgressReporter>(
        progress_out, max_steps, ExamplesPerStep(config, static_cast<int>(cluster.TrainingTasks().size())));

  std::vector<absl::Status> statuses(workers.size());
  TrainReport report;
  std::vector<std::thread> worker_threads;
  for (size_t i = 0; i < workers.size(); ++i) {
    worker_threads.emplace_back([&, i] {
      UseComputeThreadsInThisThread();
      auto client = Client::Create(cluster, &transport, placement, ClientOptionsFor(config));
      if (!client.ok()) {
        statuses[i] = client.status();
        return;
      }
      WorkerContext context = MakeWorkerContext(config, cluster, workers[i], client->get(), data.train, max_steps);
      if (progress) {
        context.on_step = [&](int64_t step, double loss, double auc) { progress->OnStep(step, loss, auc); };
      }
      watching->WatchWorker(context);
      if (customize) customize(context);
      statuses[i] = RunWorkerSession(context, config.hooks, data.test, &report);
    });
  }
  for (auto& t : worker_threads) t.join();
  if (progress) progress->Finish();
  if (absl::Status written = watching->Finish(); !written.ok()) {
    absl::FPrintF(stderr, "the trace was not written: %s\n", written.message());
  }
  for (const absl::Status& s : statuses) SHOAL_RETURN_IF_ERROR(s);
  DescribeCompute(threads, &report);
  WriteRunReport(report);
  return report;
}

namespace {

// Binds a fresh loopback TCP socket to `port` (0: the kernel picks); the
// socket, or -1 if the port is taken.
int BindLoopback(int port, int* bound_port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return -1;
  }
  *bound_port = ntohs(addr.sin_port);
  return fd;
}

// The lowest port the kernel picks itself (bind to port 0, outgoing
// connections), or 0 if unknown.
int LowestEphemeralPort() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  return range >> low ? low : 0;
}

}  // namespace

absl::StatusOr<std::vector<int>> FreeLoopbackPorts(int n) {
  // Ports below the kernel's ephemeral range, where it can: the kernel never
  // hands those to a bind() to port 0, which every UCX worker's TCP
  // listener and many libraries do, so between this pick and the task's own
  // bind (and across a task's restart) nothing else on the host takes them
  // by chance. Every socket stays bound until all are picked: the kernel may
  // hand the same free port to two bind() calls in a row.
  constexpr int kLowestPort = 10000;
  const int span = LowestEphemeralPort() - kLowestPort;
  std::vector<int> fds, ports;
  if (span >= 1000) {
    std::mt19937 random(std::random_device{}() ^ static_cast<unsigned>(getpid()));
    const int start = static_cast<int>(random() % static_cast<unsigned>(span));
    for (int i = 0; i < span && static_cast<int>(ports.size()) < n; ++i) {
      int port = 0;
      const int fd = BindLoopback(kLowestPort + (start + i) % span, &port);
      if (fd < 0) continue;
      fds.push_back(fd);
      ports.push_back(port);
    }
  }
  while (static_cast<int>(ports.size()) < n) {  // no room below the range: the kernel's pick
    int port = 0;
    const int fd = BindLoopback(0, &port);
    if (fd < 0) break;
    fds.push_back(fd);
    ports.push_back(port);
  }
  for (int fd : fds) close(fd);
  if (static_cast<int>(ports.size()) < n) return absl::InternalError("cannot find free loopback ports");
  return ports;
}

namespace {

struct Child {
  TaskId task;
  pid_t pid = -1;
  bool exited = false;
  int status = 0;
  bool leaving = false;  // told to leave the job (leased data): its exit is not restarted
};

// Leased data: SIGUSR1 asks the launcher for one more worker, SIGUSR2 for
// one fewer (elastic workers on one machine; the chaos soak drives them).
std::atomic<int> g_workers_to_add{0};
std::atomic<int> g_workers_to_remove{0};
void OnAddWorker(int) { g_workers_to_add.fetch_add(1); }
void OnRemoveWorker(int) { g_workers_to_remove.fetch_add(1); }

absl::StatusOr<pid_t> Spawn(const std::string& binary, const std::vector<std::string>& args) {
  const pid_t launcher = getpid();
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork() failed");
  if (pid == 0) {
    // The task dies with the launcher, however the launcher ends; if it is
    // already gone, before this could be set, the task does not start.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(127);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(binary.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

// Starts the workers SIGUSR1 asked for (worker:N, N past the listed ones:
// they join the job) and tells those SIGUSR2 asked to go to leave (SIGTERM:
// the newest worker still running, never the chief).
template <typename ArgsFor>
void ScaleWorkers(const std::string& binary, const ArgsFor& args_for, int* next_joiner, std::vector<Child>& children) {
  for (; g_workers_to_add.load() > 0; g_workers_to_add.fetch_sub(1)) {
    const TaskId task{"worker", (*next_joiner)++};
    auto pid = Spawn(binary, args_for(task));
    if (!pid.ok()) {
      absl::FPrintF(stderr, "shoal: cannot start %s: %s\n", task.ToString(), pid.status().message());
      continue;
    }
    children.push_back({task, *pid});
    absl::FPrintF(stderr, "shoal: %s joins the job\n", task.ToString());
  }
  for (; g_workers_to_remove.load() > 0; g_workers_to_remove.fetch_sub(1)) {
    for (auto c = children.rbegin(); c != children.rend(); ++c) {
      if (c->exited || c->leaving || c->task.job != "worker" || c->task.index == 0) continue;
      c->leaving = true;
      kill(c->pid, SIGTERM);
      absl::FPrintF(stderr, "shoal: %s leaves the job\n", c->task.ToString());
      break;
    }
  }
}

void StopAll(std::vector<Child>& children) {
  for (Child& c : children) {
    if (!c.exited) kill(c.pid, SIGTERM);
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  for (Child& c : children) {
    while (!c.exited) {
      if (waitpid(c.pid, &c.status, WNOHANG) == c.pid) {
        c.exited = true;
      } else if (absl::Now() > give_up) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &c.status, 0);
        c.exited = true;
      } else {
        absl::SleepFor(absl::Milliseconds(20));
      }
    }
  }
}

// 32 bytes from the kernel's random source, as hex.
std::string RandomToken() {
  std::random_device source;  // /dev/urandom on Linux
  std::string token;
  for (int i = 0; i < 8; ++i) token += absl::StrFormat("%08x", source());
  return token;
}

// Writes `text` to a new file readable by this user only (0600).
absl::Status WritePrivateFile(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create '", path, "': ", std::strerror(errno)));
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!written) return absl::InternalError(absl::StrCat("cannot write '", path, "'"));
  return absl::OkStatus();
}

constexpr char kLauncherPidFile[] = "launcher.pid";

// A launcher killed by SIGKILL cannot remove its job folder; the next launch
// removes every folder whose launcher is gone (its tasks died with it).
void RemoveAbandonedJobFolders() {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/tmp", error)) {
    if (entry.path().filename().string().rfind("shoal-job-", 0) != 0) continue;
    std::ifstream in(entry.path() / kLauncherPidFile);
    pid_t pid = 0;
    if (!(in >> pid) || pid <= 0) continue;  // being set up, or not ours to judge
    if (kill(pid, 0) == 0 || errno == EPERM) continue;  // its launcher lives
    std::filesystem::remove_all(entry.path(), error);
  }
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("was killed by signal ", WTERMSIG(status));
  return "ended abnormally";
}

}  // namespace

absl::StatusOr<LocalJobFiles> WriteLocalJobFiles(JobConfig config, const ClusterSpec& cluster) {
  RemoveAbandonedJobFolders();
  char dir_template[] = "/tmp/shoal-job-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return absl::InternalError("cannot create a temporary directory");
  LocalJobFiles files;
  files.dir = dir_template;
  std::ofstream(std::filesystem::path(files.dir) / kLauncherPidFile) << getpid();
  files.cluster_file = (std::filesystem::path(files.dir) / "cluster.json").string();
  files.config_file = (std::filesystem::path(files.dir) / "config.yaml").string();
  files.result_file = (std::filesystem::path(files.dir) / "result.json").string();
  std::ofstream(files.cluster_file) << cluster.ToJson();
  if (config.security.token.empty() && config.security.token_file.empty()) {
    // A fresh token for every job, in a file only this user can read: another
    // local user, or a stray process reaching the ports, cannot join or stop it.
    config.security.token_file = (std::filesystem::path(files.dir) / "token").string();
    if (absl::Status written = WritePrivateFile(config.security.token_file, RandomToken()); !written.ok()) {
      std::filesystem::remove_all(files.dir);
      return written;
    }
  }
  std::ofstream(files.config_file) << JobConfigToYaml(config);
  return files;
}

int MetricsPortOf(const JobConfig& config, const ClusterSpec& cluster, const TaskId& task) {
  const std::vector<TaskId> tasks = cluster.AllTasks();
  return config.hooks.metrics_port + static_cast<int>(std::find(tasks.begin(), tasks.end(), task) - tasks.begin());
}

absl::StatusOr<TrainReport> TrainInLocalProcesses(const JobConfig& config_in, const std::string& shoal_binary,
                                                  bool show_progress, const std::atomic<int>* signal) {
  SHOAL_RETURN_IF_ERROR(ValidateJobConfig(config_in));
  JobConfig config = config_in;
  config.cluster.processes = false;  // the children are the processes
  std::map<std::string, std::vector<std::string>> jobs;
  SHOAL_ASSIGN_OR_RETURN(std::vector<int> ports, FreeLoopbackPorts(config.cluster.ps + config.cluster.workers));
  for (int i = 0; i < config.cluster.ps + config.cluster.workers; ++i) {
    jobs[i < config.cluster.ps ? "ps" : "worker"].push_back(absl::StrCat("127.0.0.1:", ports[i]));
  }
  SHOAL_ASSIGN_OR_RETURN(ClusterSpec cluster, ClusterSpec::Create(jobs));

  SHOAL_ASSIGN_OR_RETURN(const LocalJobFiles files, WriteLocalJobFiles(config, cluster));
  const std::filesystem::path dir = files.dir;
  const std::string &cluster_file = files.cluster_file, &config_file = files.config_file,
                    &result_file = files.result_file;
  const std::string trained_file = (dir / "trained.pt").string();  // the chief's trained tensors

  // Each task writes its error there if it fails, so that the job's error
  // says what went wrong, not just which task's exit code was 1.
  auto error_file = [&](const TaskId& task) {
    return (dir / absl::StrCat(task.job, "_", task.index, ".error")).string();
  };
  auto args_for = [&](const TaskId& task) {
    std::vector<std::string> args = {task.job == "ps" ? "server" : "worker", "--cluster", cluster_file,
                                     "--task", task.ToString(), "--config", config_file,
                                     "--error_file", error_file(task)};
    if (config.hooks.metrics_port > 0) {
      // One endpoint a process: each task on the next port, in cluster order.
      args.insert(args.end(), {"--set", absl::StrCat("hooks.metrics_port=", MetricsPortOf(config, cluster, task))});
    }
    if (cluster.IsChief(task)) {
      args.insert(args.end(), {"--result_file", result_file, "--trained_file", trained_file});
      if (!show_progress) args.push_back("--quiet");
    } else if (task.job == "worker") {
      args.push_back("--quiet");
    }
    return args;
  };
  std::vector<Child> children;
  int next_joiner = static_cast<int>(cluster.Tasks("worker").size());
  if (config.data.leases) {
    g_workers_to_add.store(0);
    g_workers_to_remove.store(0);
    ::signal(SIGUSR1, OnAddWorker);
    ::signal(SIGUSR2, OnRemoveWorker);
  }
  for (const TaskId& task : cluster.AllTasks()) {
    auto pid = Spawn(shoal_binary, args_for(task));
    if (!pid.ok()) {
      StopAll(children);
      return pid.status();
    }
    children.push_back({task, *pid});
  }

  // Training time is unknown in advance; what must not happen is a silent
  // hang, so each task's exit is watched. A worker task that fails is
  // started again while the restart budget lasts (it rejoins as a restarted
  // worker does), and so is a ps task when the job keeps checkpoints (the
  // chief restores it); any other failure ends the job.
  //
  // Nothing waits forever: once the chief is done (or a signal has been
  // passed on), the other tasks get a deadline to exit, after which they are
  // stopped and named.
  absl::Status failure;
  std::vector<std::string> restarts;
  bool all_done = false, signal_forwarded = false;
  absl::Time exit_deadline = absl::InfiniteFuture();
  const absl::Duration after_chief = absl::Seconds(config.transport.rpc_timeout_s) + absl::Seconds(10);
  const absl::Duration after_signal = TaskOptions().grace_after_signal + absl::Seconds(10);
  while (!all_done && failure.ok()) {
    if (signal != nullptr && signal->load() != 0 && !signal_forwarded) {
      for (Child& c : children) {
        if (!c.exited) kill(c.pid, SIGTERM);  // each stops as a task given SIGTERM does
      }
      signal_forwarded = true;
      exit_deadline = std::min(exit_deadline, absl::Now() + after_signal);
    }
    if (absl::Now() > exit_deadline) {
      std::vector<std::string> hung;
      for (const Child& c : children) {
        if (!c.exited) hung.push_back(c.task.ToString());
      }
      absl::FPrintF(stderr, "shoal: %s still running %s after the job ended; stopping %s\n", absl::StrJoin(hung, ", "),
                    absl::FormatDuration(signal_forwarded ? after_signal : after_chief),
                    hung.size() == 1 ? "it" : "them");
      break;
    }
    if (config.data.leases && exit_deadline == absl::InfiniteFuture()) {
      ScaleWorkers(shoal_binary, args_for, &next_joiner, children);
    }
    all_done = true;
    for (Child& c : children) {
      if (!c.exited && waitpid(c.pid, &c.status, WNOHANG) == c.pid) {
        c.exited = true;
        const bool succeeded = (WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) ||
                               (c.leaving && WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGTERM);
        if (succeeded && cluster.IsChief(c.task)) exit_deadline = std::min(exit_deadline, absl::Now() + after_chief);
        if (!succeeded) {
          std::string what = absl::StrCat(c.task.ToString(), " ", DescribeExit(c.status));
          if (auto said = ReadTextFile(error_file(c.task), "error file"); said.ok() && !said->empty()) {
            absl::StrAppend(&what, ": ", absl::StripTrailingAsciiWhitespace(*said));
            std::filesystem::remove(error_file(c.task));  // a restarted task writes its own
          }
          // A ps task comes back empty: only a checkpoint can give it its
          // variables back, so without checkpoints it is not restarted.
          const bool restartable = c.task.job != "ps" || !config.checkpoint.dir.empty();
          const bool budget_spent = static_cast<int>(restarts.size()) >= config.cluster.max_restarts;
          if (config.data.leases && c.task.job == "worker" && !cluster.IsChief(c.task) && budget_spent &&
              !signal_forwarded) {
            // On leased data the job trains on without it: its lease runs
            // out and another worker takes the shard over.
            absl::FPrintF(stderr, "shoal: %s; the job trains on without it\n", what);
          } else if (!restartable || signal_forwarded || budget_spent) {
            failure = absl::InternalError(
                !restartable || config.cluster.max_restarts == 0
                    ? what
                    : absl::StrCat(what, "; the restart budget (cluster.max_restarts = ", config.cluster.max_restarts,
                                   ") is spent: ", absl::StrJoin(restarts, "; ")));
          } else {
            restarts.push_back(absl::StrCat(what, ", restarted (", restarts.size() + 1, " of ",
                                            config.cluster.max_restarts, ")"));
            absl::FPrintF(stderr, "shoal: %s\n", restarts.back());
            auto pid = Spawn(shoal_binary, args_for(c.task));
            if (!pid.ok()) {
              failure = pid.status();
            } else {
              c = Child{c.task, *pid};
            }
          }
        }
      }
      all_done = all_done && c.exited;
    }
    if (!all_done) absl::SleepFor(absl::Milliseconds(50));
  }
  StopAll(children);
  if (!failure.ok()) {
    std::filesystem::remove_all(dir);
    return failure;
  }
  std::ifstream in(result_file);
  nlohmann::json result = nlohmann::json::parse(in, nullptr, false);
  absl::StatusOr<NamedTensors> trained = LoadWeightsFile(trained_file);
  std::filesystem::remove_all(dir);
  if (result.is_discarded()) return absl::InternalError("the chief left no readable result");
  SHOAL_ASSIGN_OR_RETURN(TrainReport report, ReportFromJson(result));
  if (!trained.ok()) return Annotate(trained.status(), "the chief's trained model");
  report.trained_names = std::move(trained->names);
  report.trained_values = std::move(trained->values);
  report.restarts = restarts;
  WriteRunReport(report);
  return report;
}

}  // namespace shoal
