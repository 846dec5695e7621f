#include "shoal/cluster/cluster_spec.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "shoal/core/file.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

const std::set<std::string>& KnownJobs() {
  static const auto* jobs = new std::set<std::string>{"chief", "ps", "worker", "evaluator"};
  return *jobs;
}

constexpr char kKnownJobsText[] = "known jobs are chief (or master), ps, worker, evaluator";

// The most tasks a job in the sparse form may number: its indices become a
// vector, so a hostile "1000000000" must not allocate one.
constexpr int kMaxSparseIndex = 1 << 16;

// Older TFJobs name the chief "master".
std::string CanonicalJob(const std::string& job) { return job == "master" ? "chief" : job; }

// A job's addresses: a list by index, or TensorFlow's sparse form, an object
// from index to address ({"1": "host:port"}) naming only some tasks, whose
// missing addresses stay empty (and are marked in `sparse`).
absl::Status AddressesFromJson(const std::string& job, const nlohmann::json& addresses, std::vector<std::string>* out,
                               std::set<std::string>* sparse) {
  if (addresses.is_array()) {
    for (const auto& address : addresses) {
      if (!address.is_string()) {
        return absl::InvalidArgumentError(absl::StrCat("job '", job, "' has an address that is not a string"));
      }
      out->push_back(address.get<std::string>());
    }
    return absl::OkStatus();
  }
  if (!addresses.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job '", job, "' must list its task addresses as an array, or as an object from index to address"));
  }
  sparse->insert(job);
  for (const auto& [key, address] : addresses.items()) {
    int index = -1;
    if (!absl::SimpleAtoi(key, &index) || index < 0 || index >= kMaxSparseIndex) {
      return absl::InvalidArgumentError(absl::StrCat("job '", job, "' has task index '", key,
                                                     "'; expected an integer from 0 to ", kMaxSparseIndex - 1));
    }
    if (!address.is_string() || address.get<std::string>().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("job '", job, "' task ", key, " has no address string"));
    }
    if (static_cast<int>(out->size()) <= index) out->resize(index + 1);
    (*out)[index] = address.get<std::string>();
  }
  return absl::OkStatus();
}

absl::StatusOr<ClusterSpec> SpecFromJson(const nlohmann::json& cluster, ClusterUse use) {
  if (!cluster.is_object()) return absl::InvalidArgumentError("cluster must be a JSON object of job -> addresses");
  std::map<std::string, std::vector<std::string>> jobs;
  std::set<std::string> sparse;
  for (const auto& [given, addresses] : cluster.items()) {
    const std::string job = CanonicalJob(given);
    if (jobs.count(job)) {
      return absl::InvalidArgumentError("the cluster has both 'master' and 'chief' jobs; name the chief once");
    }
    SHOAL_RETURN_IF_ERROR(AddressesFromJson(given, addresses, &jobs[job], &sparse));
  }
  return ClusterSpec::Create(std::move(jobs), sparse, use);
}

}  // namespace

std::string TaskId::ToString() const { return absl::StrCat("/job:", job, "/task:", index); }

absl::StatusOr<TaskId> ParseTaskId(const std::string& text) {
  TaskId task;
  absl::string_view rest = text;
  std::string index_text;
  if (absl::ConsumePrefix(&rest, "/job:")) {
    std::vector<std::string> parts = absl::StrSplit(rest, '/');
    if (parts.size() < 2 || !absl::StartsWith(parts.back(), "task:")) {
      return absl::InvalidArgumentError(absl::StrCat("bad task name '", text, "'; expected /job:NAME/task:INDEX"));
    }
    task.job = CanonicalJob(parts[0]);
    index_text = parts.back().substr(5);
  } else {
    std::vector<std::string> parts = absl::StrSplit(rest, ':');
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("bad task name '", text, "'; expected JOB:INDEX"));
    }
    task.job = CanonicalJob(parts[0]);
    index_text = parts[1];
  }
  if (!absl::SimpleAtoi(index_text, &task.index) || task.index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad task index in '", text, "'"));
  }
  if (!KnownJobs().count(task.job)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown job '", task.job, "' in '", text, "'; ", kKnownJobsText));
  }
  return task;
}

namespace {

// "localhost:2222" and "127.0.0.1:2222" name one socket; host names compare
// without case.
std::string CanonicalAddress(const std::string& address) {
  std::string host = absl::AsciiStrToLower(HostOf(address));
  if (host == "localhost") host = "127.0.0.1";
  const size_t colon = address.rfind(':');
  return absl::StrCat(host, "|", colon == std::string::npos ? "" : address.substr(colon + 1));
}

}  // namespace

absl::StatusOr<ClusterSpec> ClusterSpec::Create(std::map<std::string, std::vector<std::string>> jobs,
                                                const std::set<std::string>& sparse_jobs, ClusterUse use) {
  std::map<std::string, TaskId> seen;
  for (const auto& [job, addresses] : jobs) {
    if (!KnownJobs().count(job)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown job '", job, "' in the cluster; ", kKnownJobsText));
    }
    if (addresses.empty()) return absl::InvalidArgumentError(absl::StrCat("job '", job, "' has no tasks"));
    for (size_t i = 0; i < addresses.size(); ++i) {
      TaskId task{job, static_cast<int>(i)};
      if (addresses[i].empty()) {
        if (sparse_jobs.count(job)) continue;  // a task this spec does not list
        return absl::InvalidArgumentError(absl::StrCat(task.ToString(), " has an empty address"));
      }
      // localhost and 127.0.0.1 are one host: two tasks there would share a port.
      auto [it, inserted] = seen.emplace(CanonicalAddress(addresses[i]), task);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("duplicate address '", addresses[i], "' for ",
                                                       it->second.ToString(), " and ", task.ToString(),
                                                       " (the same host and port, however written)"));
      }
    }
  }
  if (jobs.count("chief") && jobs["chief"].size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("job 'chief' must have exactly one task, has ", jobs["chief"].size()));
  }
  if (!jobs.count("ps")) return absl::InvalidArgumentError("the cluster has no 'ps' job");
  if (use == ClusterUse::kTraining && !jobs.count("worker") && !jobs.count("chief")) {
    return absl::InvalidArgumentError("the cluster has no 'worker' or 'chief' job");
  }
  ClusterSpec spec;
  spec.jobs_ = std::move(jobs);
  return spec;
}

absl::StatusOr<ClusterSpec> ClusterSpec::FromJson(const std::string& json_text, ClusterUse use) {
  nlohmann::json doc = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("cluster spec is not valid JSON");
  return SpecFromJson(doc.contains("cluster") ? doc["cluster"] : doc, use);
}

absl::StatusOr<ClusterSpec> ClusterSpec::FromJsonFile(const std::string& path) {
  SHOAL_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, "cluster file"));
  auto spec = FromJson(text);
  if (!spec.ok()) return Annotate(spec.status(), absl::StrCat("cluster file '", path, "'"));
  return spec;
}

ClusterSpec ClusterSpec::Local(int num_ps, int num_workers, int first_port) {
  std::map<std::string, std::vector<std::string>> jobs;
  int port = first_port;
  for (const char* job : {"ps", "worker"}) {
    int n = std::string(job) == "ps" ? num_ps : num_workers;
    for (int i = 0; i < n; ++i) {
      jobs[job].push_back(first_port == 0 ? absl::StrCat("inproc:", job, ":", i)
                                          : absl::StrCat("127.0.0.1:", port++));
    }
  }
  ClusterSpec spec;
  spec.jobs_ = std::move(jobs);
  return spec;
}

int ClusterSpec::NumTasks(const std::string& job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? 0 : static_cast<int>(it->second.size());
}

const std::vector<std::string>& ClusterSpec::Addresses(const std::string& job) const {
  static const auto* empty = new std::vector<std::string>();
  auto it = jobs_.find(job);
  return it == jobs_.end() ? *empty : it->second;
}

absl::StatusOr<std::string> ClusterSpec::AddressOf(const TaskId& task) const {
  if (!HasTask(task)) {
    return absl::NotFoundError(absl::StrCat(task.ToString(), " is not in the cluster (job '", task.job,
                                            "' has ", NumTasks(task.job), " tasks)"));
  }
  const std::string& address = jobs_.at(task.job)[task.index];
  if (address.empty()) {
    return absl::NotFoundError(absl::StrCat("the address of ", task.ToString(),
                                            " is not in this task's cluster spec (its sparse form lists only some "
                                            "tasks of job '", task.job, "')"));
  }
  return address;
}

std::vector<TaskId> ClusterSpec::Tasks(const std::string& job) const {
  std::vector<TaskId> tasks;
  for (int i = 0; i < NumTasks(job); ++i) tasks.push_back({job, i});
  return tasks;
}

std::vector<TaskId> ClusterSpec::AllTasks() const {
  std::vector<TaskId> tasks;
  for (const auto& [job, addresses] : jobs_) {
    for (size_t i = 0; i < addresses.size(); ++i) {
      if (!addresses[i].empty()) tasks.push_back({job, static_cast<int>(i)});
    }
  }
  return tasks;
}

bool ClusterSpec::HasTask(const TaskId& task) const {
  return task.index >= 0 && task.index < NumTasks(task.job);
}

TaskId ClusterSpec::Chief() const { return NumTasks("chief") > 0 ? TaskId{"chief", 0} : TaskId{"worker", 0}; }

std::vector<TaskId> ClusterSpec::TrainingTasks() const {
  std::vector<TaskId> tasks = Tasks("chief");
  for (const TaskId& t : Tasks("worker")) tasks.push_back(t);
  return tasks;
}

std::string HostOf(const std::string& address) {
  if (!address.empty() && address[0] == '[') return address.substr(1, address.find(']') - 1);
  return address.substr(0, address.rfind(':'));
}

bool IsLoopbackAddress(const std::string& address) {
  const std::string host = HostOf(address);
  if (host == "localhost" || host == "::1") return true;
  in_addr ipv4{};
  return inet_pton(AF_INET, host.c_str(), &ipv4) == 1 && (ntohl(ipv4.s_addr) >> 24) == 127;  // 127.0.0.0/8
}

namespace {

// The IP address in a gRPC peer string ("ipv4:10.0.0.5:41234",
// "ipv6:[::1]:41234"), an IPv4 address mapped into IPv6 given as IPv4.
std::string PeerIp(const std::string& peer) {
  std::string rest = peer.substr(peer.find(':') + 1);
  std::string ip = HostOf(rest);
  if (absl::StartsWith(ip, "::ffff:")) ip = ip.substr(7);
  return ip;
}

bool IsLoopbackIp(const std::string& ip) { return IsLoopbackAddress(absl::StrCat(ip, ":0")); }

// Whether `host` (a name or an address) names the machine at `ip`.
bool HostHasIp(const std::string& host, const std::string& ip) {
  if (host == ip) return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool match = false;
  for (addrinfo* a = found; a != nullptr && !match; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw = a->ai_family == AF_INET ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
                                              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
    if (inet_ntop(a->ai_family, raw, text, sizeof(text)) != nullptr) match = ip == text;
  }
  freeaddrinfo(found);
  return match;
}

}  // namespace

bool IsPeerOfJob(const std::string& peer, const ClusterSpec& cluster) {
  const std::string ip = PeerIp(peer);
  for (const TaskId& task : cluster.AllTasks()) {
    const std::string host = HostOf(*cluster.AddressOf(task));
    if (IsLoopbackIp(ip) && IsLoopbackAddress(absl::StrCat(host, ":0"))) return true;
    if (HostHasIp(host, ip)) return true;
  }
  return false;
}

int ClusterSpec::TrainingTasksOnHostOf(const TaskId& task) const {
  auto self = AddressOf(task);
  if (!self.ok()) return 0;
  const std::string host = HostOf(*self);
  int count = 0;
  for (const TaskId& t : TrainingTasks()) {
    auto address = AddressOf(t);
    if (address.ok() && HostOf(*address) == host) ++count;
  }
  return count;
}

std::string ClusterSpec::ToJson() const { return nlohmann::json(jobs_).dump(); }

absl::StatusOr<TfConfig> ParseTfConfig(const std::string& json_text) {
  nlohmann::json doc = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return absl::InvalidArgumentError("TF_CONFIG is not a JSON object");
  if (!doc.contains("cluster")) return absl::InvalidArgumentError("TF_CONFIG has no 'cluster'");
  auto spec = SpecFromJson(doc["cluster"], ClusterUse::kTraining);
  if (!spec.ok()) return Annotate(spec.status(), "TF_CONFIG");
  const nlohmann::json& task = doc.value("task", nlohmann::json::object());
  if (!task.contains("type") || !task["type"].is_string()) {
    return absl::InvalidArgumentError("TF_CONFIG has no task.type");
  }
  if (!task.contains("index") || !task["index"].is_number_integer()) {
    return absl::InvalidArgumentError("TF_CONFIG has no integer task.index");
  }
  TaskId id{CanonicalJob(task["type"].get<std::string>()), task["index"].get<int>()};
  // The training operator leaves the evaluator out of the cluster (it is no
  // part of training): it has no address, and nobody calls it.
  const bool unlisted_evaluator = id.job == "evaluator" && spec->NumTasks("evaluator") == 0;
  if (!spec->HasTask(id) && !unlisted_evaluator) {
    return absl::InvalidArgumentError(absl::StrCat("TF_CONFIG task ", id.ToString(),
                                                   " is out of range: job '", id.job, "' has ",
                                                   spec->NumTasks(id.job), " tasks"));
  }
  return TfConfig{*std::move(spec), id};
}

}  // namespace shoal
