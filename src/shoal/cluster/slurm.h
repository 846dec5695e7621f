// A shoal cluster from a SLURM job step, as TensorFlow's
// SlurmClusterResolver builds one: `srun` starts every task with the same
// command, and each finds its job and index from its SLURM rank and a spec
// such as "ps:2,worker:8" (ranks 0-1 are the ps tasks, ranks 2-9 the
// workers, in that order). Ranks fill the nodes in SLURM's block order; a
// task listens on port_base plus how many tasks of the step come before it
// on its node.
//
// Reads no environment itself: the command line passes SLURM's variables.
#ifndef SHOAL_CLUSTER_SLURM_H_
#define SHOAL_CLUSTER_SLURM_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/cluster/cluster_spec.h"

namespace shoal {

// The variables of a SLURM job step that place its tasks, as strings from
// the environment (empty: unset).
struct SlurmEnvironment {
  std::string procid;          // SLURM_PROCID: this task's rank, 0-based
  std::string num_tasks;       // SLURM_STEP_NUM_TASKS
  std::string nodelist;        // SLURM_STEP_NODELIST: "node[01-03,07],login1"
  std::string tasks_per_node;  // SLURM_STEP_TASKS_PER_NODE: "2(x3),1"
};

// The hosts of a SLURM hostlist, in order: "node[01-03,07],gpu1" ->
// node01 node02 node03 node07 gpu1 (zero padding kept; several bracket
// groups in one name expand in order).
absl::StatusOr<std::vector<std::string>> ExpandSlurmHostlist(const std::string& hostlist);

// "2(x3),1" -> 2 2 2 1.
absl::StatusOr<std::vector<int>> ExpandSlurmTasksPerNode(const std::string& text);

struct SlurmTask {
  ClusterSpec cluster;
  TaskId task;
};

// This task and the whole cluster from `env` and `jobs` ("ps:2,worker:8";
// also chief and evaluator), whose counts must add up to the step's tasks.
// Errors name the variable or the spec entry that is wrong.
absl::StatusOr<SlurmTask> ResolveSlurmCluster(const SlurmEnvironment& env, const std::string& jobs, int port_base);

}  // namespace shoal

#endif  // SHOAL_CLUSTER_SLURM_H_
