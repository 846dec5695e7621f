// ClusterSpec: which jobs exist, how many tasks each has, and their addresses;
// TaskId: one task's identity ("/job:ps/task:1").
//
// A spec comes from a JSON cluster file ({"ps": [...], "worker": [...]}, or
// the same under a "cluster" key), from TF_CONFIG as Kubeflow's TFJob sets it
// ({"cluster": {...}, "task": {"type": "worker", "index": 1}}), or is built in
// code. Every constructor validates: known jobs only (chief, ps, worker,
// evaluator; "master" is read as chief, as older TFJobs name it), no empty
// job, no duplicate address, at most one chief, and at least one ps and one
// worker. A job may be given in TensorFlow's sparse form, {"1": "host:port"}:
// the tasks it leaves out exist but have no address here. Immutable once
// built; safe to share between threads.
#ifndef SHOAL_CLUSTER_CLUSTER_SPEC_H_
#define SHOAL_CLUSTER_CLUSTER_SPEC_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shoal {

struct TaskId {
  std::string job;
  int index = 0;

  std::string ToString() const;  // "/job:ps/task:1"
  bool operator==(const TaskId& o) const { return job == o.job && index == o.index; }
  bool operator!=(const TaskId& o) const { return !(*this == o); }
  bool operator<(const TaskId& o) const { return job != o.job ? job < o.job : index < o.index; }
};

// Parses "ps:1", "/job:ps/task:1" or "/job:ps/replica:0/task:1".
absl::StatusOr<TaskId> ParseTaskId(const std::string& text);

// What a spec must hold: a training job has a worker or a chief job besides
// its ps; a client of the ps tasks alone (the public API's ClusterClient)
// needs only them.
enum class ClusterUse { kTraining, kPsClient };

class ClusterSpec {
 public:
  // Validates `jobs` (job name -> task addresses, by index). In
  // `sparse_jobs` an empty address is a task this spec does not list.
  static absl::StatusOr<ClusterSpec> Create(std::map<std::string, std::vector<std::string>> jobs,
                                            const std::set<std::string>& sparse_jobs = {},
                                            ClusterUse use = ClusterUse::kTraining);
  // Parses the JSON text of a cluster file.
  static absl::StatusOr<ClusterSpec> FromJson(const std::string& json_text, ClusterUse use = ClusterUse::kTraining);
  static absl::StatusOr<ClusterSpec> FromJsonFile(const std::string& path);
  // A spec with `num_ps` ps tasks and `num_workers` workers on 127.0.0.1,
  // ports from `first_port` (0 means "in-process, no ports": inproc:ps:0 ...).
  static ClusterSpec Local(int num_ps, int num_workers, int first_port = 0);

  int NumTasks(const std::string& job) const;
  const std::vector<std::string>& Addresses(const std::string& job) const;
  absl::StatusOr<std::string> AddressOf(const TaskId& task) const;
  std::vector<TaskId> Tasks(const std::string& job) const;
  // Every task whose address this spec lists.
  std::vector<TaskId> AllTasks() const;
  bool HasTask(const TaskId& task) const;
  // The chief: chief:0 when there is a chief job, else worker:0.
  TaskId Chief() const;
  bool IsChief(const TaskId& task) const { return task == Chief(); }
  // Workers that train: the chief job's task (if any) and every worker.
  std::vector<TaskId> TrainingTasks() const;
  // How many training tasks share `task`'s host (by the host part of their
  // addresses), `task` included if it trains: they share its cores.
  int TrainingTasksOnHostOf(const TaskId& task) const;
  const std::map<std::string, std::vector<std::string>>& jobs() const { return jobs_; }
  std::string ToJson() const;

 private:
  std::map<std::string, std::vector<std::string>> jobs_;
};

// "10.0.0.1:2222" -> "10.0.0.1", "[::1]:2222" -> "::1".
std::string HostOf(const std::string& address);
// Whether `address` ("host:port") can be reached only from this machine:
// 127.0.0.0/8, ::1 or localhost. 0.0.0.0 and every other host are not.
bool IsLoopbackAddress(const std::string& address);

// Whether a caller seen as `peer` (gRPC's "ipv4:10.0.0.5:41234") is on a
// host of one of `cluster`'s tasks (names are resolved; every loopback
// address is one host).
bool IsPeerOfJob(const std::string& peer, const ClusterSpec& cluster);

// TF_CONFIG's content: the cluster and this process's task. An evaluator
// task may be absent from the cluster, as Kubeflow's training operator
// writes it: the evaluator is no part of training, and has no address.
struct TfConfig {
  ClusterSpec cluster;
  TaskId task;
};
absl::StatusOr<TfConfig> ParseTfConfig(const std::string& json_text);

}  // namespace shoal

#endif  // SHOAL_CLUSTER_CLUSTER_SPEC_H_
