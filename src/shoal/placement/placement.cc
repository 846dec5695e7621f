#include "shoal/placement/placement.h"

#include <fnmatch.h>

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

size_t Bytes(const std::vector<int64_t>& shape, int64_t rows) {
  size_t n = sizeof(float);
  for (size_t i = 0; i < shape.size(); ++i) n *= static_cast<size_t>(i == 0 ? rows : shape[i]);
  return n;
}

const ScopeRule* MatchRule(const std::vector<ScopeRule>& rules, const std::string& name) {
  for (const ScopeRule& rule : rules) {
    if (fnmatch(rule.pattern.c_str(), name.c_str(), 0) == 0) return &rule;
  }
  return nullptr;
}

// Picks the ps task for each new piece.
class PsChooser {
 public:
  PsChooser(std::vector<TaskId> ps, bool greedy) : ps_(std::move(ps)), bytes_(ps_.size(), 0), greedy_(greedy) {}
  TaskId Next(size_t bytes) {
    size_t pick = next_++ % ps_.size();
    if (greedy_) {
      pick = 0;
      for (size_t i = 1; i < ps_.size(); ++i) {
        if (bytes_[i] < bytes_[pick]) pick = i;
      }
    }
    bytes_[pick] += bytes;
    return ps_[pick];
  }

 private:
  std::vector<TaskId> ps_;
  std::vector<size_t> bytes_;
  bool greedy_;
  size_t next_ = 0;
};

}  // namespace

absl::StatusOr<ScopeRule> ParseScopeRule(const std::string& text) {
  size_t eq = text.rfind('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad scope rule '", text, "'; expected PATTERN=/job:NAME/task:INDEX"));
  }
  auto task = ParseTaskId(text.substr(eq + 1));
  if (!task.ok()) return Annotate(task.status(), absl::StrCat("scope rule '", text, "'"));
  return ScopeRule{text.substr(0, eq), *task};
}

absl::StatusOr<Placement> Placement::Create(const std::vector<VariableSpec>& variables, const ClusterSpec& cluster,
                                            const PlacementOptions& options) {
  if (options.strategy != "round_robin" && options.strategy != "greedy") {
    return absl::InvalidArgumentError(absl::StrCat("unknown placement strategy '", options.strategy,
                                                   "'; known: round_robin, greedy"));
  }
  for (const ScopeRule& rule : options.scope_rules) {
    if (!cluster.HasTask(rule.task)) {
      return absl::InvalidArgumentError(absl::StrCat("scope rule '", rule.pattern, "' names ", rule.task.ToString(),
                                                     ", which is not in the cluster"));
    }
  }
  std::vector<TaskId> ps = cluster.Tasks("ps");
  if (ps.empty()) return absl::InvalidArgumentError("cannot place variables: the cluster has no ps tasks");
  PsChooser chooser(ps, options.strategy == "greedy");
  Placement placement;
  placement.scope_rules_ = options.scope_rules;
  placement.counter_task_ = ps[0];
  for (const VariableSpec& var : variables) {
    for (int64_t d : var.shape) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("variable '", var.name, "' has a negative dimension"));
    }
    if (placement.variables_.count(var.name)) {
      return absl::InvalidArgumentError(absl::StrCat("variable '", var.name, "' is defined twice"));
    }
    VariablePlacement& vp = placement.variables_[var.name];
    vp.shape = var.shape;
    const int64_t rows = var.shape.empty() ? 1 : var.shape[0];
    if (const ScopeRule* rule = MatchRule(options.scope_rules, var.name)) {
      vp.shards.push_back({var.name, rule->task, 0, rows});
      continue;
    }
    int64_t parts = 1;
    if (options.min_partition_bytes > 0 && !var.shape.empty() && Bytes(var.shape, rows) >= options.min_partition_bytes) {
      parts = std::min<int64_t>(ps.size(), rows);
      if (options.max_partitions > 0) parts = std::min<int64_t>(parts, options.max_partitions);
    }
    if (parts <= 1) {
      vp.shards.push_back({var.name, chooser.Next(Bytes(var.shape, rows)), 0, rows});
      continue;
    }
    // Like TensorFlow's partitioners, the first (rows % parts) slices get one extra row.
    int64_t begin = 0;
    for (int64_t p = 0; p < parts; ++p) {
      int64_t size = rows / parts + (p < rows % parts ? 1 : 0);
      vp.shards.push_back({absl::StrCat(var.name, "/part_", p), chooser.Next(Bytes(var.shape, size)), begin, begin + size});
      begin += size;
    }
  }
  return placement;
}

absl::StatusOr<VariablePlacement> Placement::Locate(const std::string& name) const {
  auto it = variables_.find(name);
  if (it != variables_.end()) return it->second;
  if (const ScopeRule* rule = MatchRule(scope_rules_, name)) {
    VariablePlacement vp;
    vp.shards.push_back({name, rule->task, 0, 0});
    return vp;
  }
  return absl::NotFoundError(absl::StrCat("variable '", name, "' is not placed: it is not in the model and no scope rule matches it"));
}

std::map<TaskId, size_t> Placement::BytesPerTask() const {
  std::map<TaskId, size_t> bytes;
  for (const auto& [name, vp] : variables_) {
    for (const Shard& s : vp.shards) bytes[s.task] += Bytes(vp.shape, s.row_end - s.row_begin);
  }
  return bytes;
}

}  // namespace shoal
