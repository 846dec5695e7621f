// For tests that start `shoal server` and `shoal worker` processes
// themselves (to kill and restart them): a loopback cluster whose cluster and
// config files live in a fresh temporary directory.
#ifndef SHOAL_TESTS_PROCESS_HELPERS_H_
#define SHOAL_TESTS_PROCESS_HELPERS_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/time/clock.h"
#include "shoal/cluster/cluster_spec.h"
#include "shoal/config/config.h"
#include "shoal/hooks/standard_hooks.h"
#include "shoal/session/local_cluster.h"
#include "source_paths.h"

namespace shoal {

// Waits up to `timeout` for `pid`; returns its wait status, or -1 on timeout.
inline int WaitFor(pid_t pid, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  int status = 0;
  while (absl::Now() < give_up) {
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return -1;
}

// The latest value of `field` ("global_step", "local_step") in a JSONL
// metrics file (hooks.metrics_dir), or -1 if it has no complete line yet.
inline int64_t LatestInMetrics(const std::filesystem::path& file, const std::string& field) {
  std::ifstream in(file);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!in.eof()) last = line;  // a line still being written has no newline yet
  }
  nlohmann::json record = nlohmann::json::parse(last, nullptr, false);
  if (record.is_discarded() || !record.contains(field)) return -1;
  return record[field].get<int64_t>();
}

// Faults are timed by what the job has done, never by the clock: waits up to
// `timeout` for the metrics `file` to show `field` >= `at_least`; returns the
// value seen, or -1 if it never got there.
inline int64_t WaitForStep(const std::filesystem::path& file, const std::string& field, int64_t at_least,
                           absl::Duration timeout = absl::Seconds(90)) {
  const absl::Time give_up = absl::Now() + timeout;
  while (absl::Now() < give_up) {
    const int64_t seen = LatestInMetrics(file, field);
    if (seen >= at_least) return seen;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return -1;
}

// Moves a metrics file aside before its writer is killed, so that the file
// the restarted task writes is a new one (its writer keeps the old one open).
inline void SetAside(const std::filesystem::path& file) {
  std::filesystem::rename(file, file.string() + ".before_kill");
}

// In a forked child: becomes `shoal <args>` (exits 127 if it cannot).
[[noreturn]] inline void ExecShoal(const std::vector<std::string>& args) {
  std::vector<char*> argv = {const_cast<char*>(SHOAL_BINARY)};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv(SHOAL_BINARY, argv.data());
  _exit(127);
}

class ProcessCluster {
 public:
  // `name` keeps the directories of concurrent tests apart. Every worker
  // writes a metrics file every 10 steps (MetricsFile), for WaitForStep.
  // `spare_ports` more free ports are kept for the test (spare_port(i)).
  ProcessCluster(const std::string& name, int ps, int workers, JobConfig config, int spare_ports = 0)
      : dir_(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(getpid()))) {
    std::filesystem::create_directories(dir_);
    config.hooks.metrics_dir = dir_ / "metrics";
    config.hooks.metrics_every_steps = 10;
    std::map<std::string, std::vector<std::string>> jobs;
    const std::vector<int> ports = FreeLoopbackPorts(ps + workers + spare_ports).value();
    spare_ports_.assign(ports.begin() + ps + workers, ports.end());
    for (int i = 0; i < ps + workers; ++i) {
      jobs[i < ps ? "ps" : "worker"].push_back("127.0.0.1:" + std::to_string(ports[i]));
    }
    std::ofstream(dir_ / "cluster.json") << ClusterSpec::Create(jobs).value().ToJson();
    std::ofstream(dir_ / "config.yaml") << JobConfigToYaml(config);
  }
  ~ProcessCluster() { std::filesystem::remove_all(dir_); }

  const std::filesystem::path& dir() const { return dir_; }
  int spare_port(int i) const { return spare_ports_.at(i); }
  int PortOf(const TaskId& task) const {
    const std::string address =
        ClusterSpec::FromJsonFile((dir_ / "cluster.json").string()).value().AddressOf(task).value();
    return std::stoi(address.substr(address.rfind(':') + 1));
  }
  std::filesystem::path MetricsFile(int worker) const {
    return dir_ / "metrics" / MetricsFileName("worker", worker, "jsonl");
  }

  // Starts `shoal <command> --task <task>` (stderr to `stderr_file` in dir()
  // if given, a result file "<task>.json" there for workers).
  // `extra` arguments go at the end (`--bind ADDR`).
  pid_t Start(const std::string& command, const std::string& task, const std::string& stderr_file = "",
              const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> args = {command, "--cluster", dir_ / "cluster.json", "--task", task,
                                     "--config", dir_ / "config.yaml", "--quiet"};
    args.insert(args.end(), extra.begin(), extra.end());
    if (command == "worker") {
      args.push_back("--result_file");
      args.push_back(dir_ / (task + ".json"));
    }
    const std::string err = stderr_file.empty() ? "" : (dir_ / stderr_file).string();
    pid_t pid = fork();
    if (pid == 0) {
      if (!err.empty() && std::freopen(err.c_str(), "w", stderr) == nullptr) _exit(126);
      ExecShoal(args);
    }
    return pid;
  }

  std::string ReadFile(const std::string& name) const {
    std::ifstream in(dir_ / name);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }

 private:
  std::filesystem::path dir_;
  std::vector<int> spare_ports_;
};

}  // namespace shoal

#endif  // SHOAL_TESTS_PROCESS_HELPERS_H_
