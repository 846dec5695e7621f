#include "shoal/cluster/slurm.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

// At most this many hosts or tasks from one variable: a garbled range must
// not make us allocate millions of names.
constexpr int64_t kMaxSlurmEntries = 1 << 16;

absl::Status BadHostlist(const std::string& hostlist, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("SLURM_STEP_NODELIST '", hostlist, "': ", why));
}

// Splits at commas outside brackets.
std::vector<std::string> SplitOutsideBrackets(const std::string& text) {
  std::vector<std::string> parts;
  std::string current;
  int depth = 0;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  parts.push_back(current);
  return parts;
}

// One name with bracket groups, expanded onto `out`.
absl::Status ExpandName(const std::string& hostlist, const std::string& name, std::vector<std::string>* out) {
  const size_t open = name.find('[');
  if (open == std::string::npos) {
    if (name.find(']') != std::string::npos) return BadHostlist(hostlist, "']' without '['");
    if (name.empty()) return BadHostlist(hostlist, "an empty host name");
    out->push_back(name);
    return absl::OkStatus();
  }
  const size_t close = name.find(']', open);
  if (close == std::string::npos) return BadHostlist(hostlist, "'[' without ']'");
  const std::string prefix = name.substr(0, open);
  const std::string rest = name.substr(close + 1);
  for (const std::string& range :
       std::vector<std::string>(absl::StrSplit(name.substr(open + 1, close - open - 1), ','))) {
    const std::vector<std::string> ends = absl::StrSplit(range, '-');
    int64_t first = 0, last = 0;
    if (ends.size() > 2 || ends[0].empty() || !absl::SimpleAtoi(ends[0], &first) ||
        !absl::SimpleAtoi(ends.back(), &last) || first < 0 || last < first) {
      return BadHostlist(hostlist, absl::StrCat("'", range, "' is not a range such as 01-04"));
    }
    if (last - first + static_cast<int64_t>(out->size()) >= kMaxSlurmEntries) {
      return BadHostlist(hostlist, absl::StrCat("more than ", kMaxSlurmEntries, " hosts"));
    }
    const int width = static_cast<int>(ends[0].size());
    for (int64_t i = first; i <= last; ++i) {
      SHOAL_RETURN_IF_ERROR(ExpandName(hostlist, absl::StrCat(prefix, absl::StrFormat("%0*d", width, i), rest), out));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ParseCount(const std::string& variable, const std::string& text) {
  int value = 0;
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat(variable, " is not set: is this a SLURM job step (srun)?"));
  if (!absl::SimpleAtoi(text, &value) || value < 0) {
    return absl::InvalidArgumentError(absl::StrCat(variable, "='", text, "' is not a count"));
  }
  return value;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandSlurmHostlist(const std::string& hostlist) {
  if (hostlist.empty()) return BadHostlist(hostlist, "not set: is this a SLURM job step (srun)?");
  std::vector<std::string> hosts;
  for (const std::string& name : SplitOutsideBrackets(hostlist)) {
    absl::Status status = ExpandName(hostlist, name, &hosts);
    if (!status.ok()) return status;
  }
  return hosts;
}

absl::StatusOr<std::vector<int>> ExpandSlurmTasksPerNode(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("SLURM_STEP_TASKS_PER_NODE '", text, "': ", why));
  };
  if (text.empty()) return bad("not set: is this a SLURM job step (srun)?");
  std::vector<int> counts;
  for (const std::string& part : std::vector<std::string>(absl::StrSplit(text, ','))) {
    int tasks = 0, repeat = 1;
    const size_t paren = part.find("(x");
    const std::string count = part.substr(0, paren);
    if (!absl::SimpleAtoi(count, &tasks) || tasks < 0) return bad(absl::StrCat("'", part, "' is not N or N(xM)"));
    if (paren != std::string::npos) {
      if (part.back() != ')' || !absl::SimpleAtoi(part.substr(paren + 2, part.size() - paren - 3), &repeat) ||
          repeat < 1) {
        return bad(absl::StrCat("'", part, "' is not N or N(xM)"));
      }
    }
    if (static_cast<int64_t>(counts.size()) + repeat > kMaxSlurmEntries) {
      return bad(absl::StrCat("more than ", kMaxSlurmEntries, " nodes"));
    }
    counts.insert(counts.end(), repeat, tasks);
  }
  return counts;
}

absl::StatusOr<SlurmTask> ResolveSlurmCluster(const SlurmEnvironment& env, const std::string& jobs, int port_base) {
  // The jobs, in the order the spec gives them.
  std::vector<std::pair<std::string, int>> spec;
  int64_t total = 0;
  for (const std::string& entry : std::vector<std::string>(absl::StrSplit(jobs, ','))) {
    const std::vector<std::string> parts = absl::StrSplit(entry, ':');
    int count = 0;
    if (parts.size() != 2 || parts[0].empty() || !absl::SimpleAtoi(parts[1], &count) || count < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--slurm '", jobs, "': '", entry, "' is not JOB:COUNT (as in ps:2,worker:8)"));
    }
    spec.emplace_back(parts[0], count);
    total += count;
  }
  if (total > kMaxSlurmEntries) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slurm '", jobs, "' asks for ", total, " tasks; shoal takes at most ", kMaxSlurmEntries));
  }
  SHOAL_ASSIGN_OR_RETURN(int rank, ParseCount("SLURM_PROCID", env.procid));
  SHOAL_ASSIGN_OR_RETURN(int num_tasks, ParseCount("SLURM_STEP_NUM_TASKS", env.num_tasks));
  SHOAL_ASSIGN_OR_RETURN(std::vector<std::string> hosts, ExpandSlurmHostlist(env.nodelist));
  SHOAL_ASSIGN_OR_RETURN(std::vector<int> per_node, ExpandSlurmTasksPerNode(env.tasks_per_node));
  if (per_node.size() != hosts.size()) {
    return absl::InvalidArgumentError(absl::StrCat("SLURM_STEP_TASKS_PER_NODE '", env.tasks_per_node, "' gives ",
                                                   per_node.size(), " nodes but SLURM_STEP_NODELIST '", env.nodelist,
                                                   "' lists ", hosts.size()));
  }
  int64_t placed = 0;
  for (int n : per_node) placed += n;
  if (placed != num_tasks) {
    return absl::InvalidArgumentError(absl::StrCat("SLURM_STEP_TASKS_PER_NODE '", env.tasks_per_node, "' places ",
                                                   placed, " tasks but SLURM_STEP_NUM_TASKS is ", num_tasks));
  }
  if (total != num_tasks) {
    return absl::InvalidArgumentError(absl::StrCat("--slurm '", jobs, "' asks for ", total,
                                                   " tasks but the job step has ", num_tasks,
                                                   " (SLURM_STEP_NUM_TASKS): they must match"));
  }
  if (rank >= num_tasks) {
    return absl::InvalidArgumentError(
        absl::StrCat("SLURM_PROCID ", rank, " is not below SLURM_STEP_NUM_TASKS ", num_tasks));
  }
  // Rank r's address: its node in block order, and its place on that node.
  std::vector<std::string> addresses;
  for (size_t node = 0; node < hosts.size(); ++node) {
    for (int local = 0; local < per_node[node]; ++local) {
      addresses.push_back(absl::StrCat(hosts[node], ":", port_base + local));
    }
  }
  std::map<std::string, std::vector<std::string>> cluster_jobs;
  SlurmTask result;
  int next = 0;
  for (const auto& [job, count] : spec) {
    std::vector<std::string>& tasks = cluster_jobs[job];
    if (!tasks.empty()) return absl::InvalidArgumentError(absl::StrCat("--slurm '", jobs, "' names ", job, " twice"));
    for (int i = 0; i < count; ++i, ++next) {
      if (next == rank) result.task = TaskId{job, i};
      tasks.push_back(addresses[next]);
    }
  }
  auto cluster = ClusterSpec::Create(std::move(cluster_jobs));
  if (!cluster.ok()) return Annotate(cluster.status(), absl::StrCat("--slurm '", jobs, "'"));
  result.cluster = std::move(*cluster);
  return result;
}

}  // namespace shoal
