// Placement: which task hosts each variable, and how a large variable is cut
// into row slices across ps tasks.
//
// Every task computes the same Placement from the same variable list and
// options (as every TensorFlow worker ran replica_device_setter on the same
// graph), so no task has to ask another where a variable lives.
//
//   round_robin   ps tasks in variable creation order (replica_device_setter)
//   greedy        the ps task with the fewest bytes so far (GreedyLoadBalancing)
//   scope rules   "worker_3/*" -> /job:worker/task:3, first match wins, checked
//                 before the strategy; a ruled variable is never partitioned
//   partitioning  a variable of at least `min_partition_bytes` becomes
//                 `name/part_0..k-1`, k = min(#ps, rows, max_partitions), each
//                 part placed by the strategy; the client hides the parts.
//
// Immutable once built; safe to share.
#ifndef SHOAL_PLACEMENT_PLACEMENT_H_
#define SHOAL_PLACEMENT_PLACEMENT_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/cluster/cluster_spec.h"

namespace shoal {

struct VariableSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// One stored piece of a variable: rows [row_begin, row_end) of dim 0, or the
// whole variable.
struct Shard {
  std::string stored_name;
  TaskId task;
  int64_t row_begin = 0;
  int64_t row_end = 0;
};

struct VariablePlacement {
  std::vector<int64_t> shape;  // empty when only a scope rule located it
  std::vector<Shard> shards;   // one unless partitioned
  bool partitioned() const { return shards.size() > 1; }
};

struct ScopeRule {
  std::string pattern;  // shell glob over variable names: "worker_3/*"
  TaskId task;
};

struct PlacementOptions {
  std::string strategy = "round_robin";  // round_robin | greedy
  std::vector<ScopeRule> scope_rules;
  size_t min_partition_bytes = 0;        // 0: never partition
  int max_partitions = 0;                // 0: as many as ps tasks
};

// Parses "worker_3/*=/job:worker/task:3" (also "worker_3/*=worker:3").
absl::StatusOr<ScopeRule> ParseScopeRule(const std::string& text);

class Placement {
 public:
  // Places `variables` (in creation order) on `cluster`'s ps tasks.
  static absl::StatusOr<Placement> Create(const std::vector<VariableSpec>& variables, const ClusterSpec& cluster,
                                          const PlacementOptions& options);

  // Where `name` lives: its placement, or a scope rule's task for a variable
  // created elsewhere (another population member's). NotFound otherwise.
  absl::StatusOr<VariablePlacement> Locate(const std::string& name) const;

  // The task that hosts counters such as global_step: the first ps task.
  const TaskId& counter_task() const { return counter_task_; }

  // Bytes placed on each task.
  std::map<TaskId, size_t> BytesPerTask() const;
  const std::map<std::string, VariablePlacement>& variables() const { return variables_; }

 private:
  std::map<std::string, VariablePlacement> variables_;
  std::vector<ScopeRule> scope_rules_;
  TaskId counter_task_{"ps", 0};
};

}  // namespace shoal

#endif  // SHOAL_PLACEMENT_PLACEMENT_H_
