// Leased data through a checkpoint: what a restore puts back on the tasks.
//
// A checkpoint keeps the lease table, read before the shards are written,
// and each shard's watermarks, taken by its task together with the shard's
// snapshot (server/data_leases.h, DataLeases::Frozen). The watermarks say
// exactly which places the saved variables and rows hold; the table says
// which epochs were open. A restore resumes each open shard at the least
// of the tasks' marks, and cuts its batches at the others, so that each
// task applies the places above its own marks and no others.
#ifndef SHOAL_CHECKPOINT_LEASE_RESTORE_H_
#define SHOAL_CHECKPOINT_LEASE_RESTORE_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/wire.pb.h"

namespace shoal {

struct LeaseRestore {
  // The lease table to restore: the saved epochs, and those the marks
  // reached while the save ran, each shard at its least mark, with cuts.
  wire::LeaseTableState table;
  // The watermarks each task restores, complete over the open shards: by
  // the name of the task that saved them (a restore onto the same tasks),
  // or one set for every task (`every_task`: the least over all shards,
  // when the variables or tables now lie elsewhere). Neither: the
  // checkpoint saved no marks (an older one), and every task goes to the
  // table's offsets.
  std::map<std::string, wire::TaskMarks> by_task;
  std::optional<wire::TaskMarks> every_task;
  // The counter task's kGlobalStep at its snapshot, where the job's step
  // count goes on from (it counts the updates the counter task applied);
  // none where the table's offsets stand (the checkpoint's step does).
  std::optional<int64_t> step;

  // The watermarks `task` restores (by name); null: the table's offsets.
  const wire::TaskMarks* MarksFor(const std::string& task) const {
    if (every_task.has_value()) return &*every_task;
    auto own = by_task.find(task);
    return own != by_task.end() ? &own->second : nullptr;
  }
};

// From `index`'s lease table and its shards' marks (`lease_marks`; none in
// an older checkpoint). `same_tasks`: every variable and table shard goes
// back to the task that saved it. DataLoss, naming `checkpoint`, for marks
// that do not fit the table.
absl::StatusOr<LeaseRestore> PlanLeaseRestore(const CheckpointIndex& index, bool same_tasks,
                                              const std::string& checkpoint);

}  // namespace shoal

#endif  // SHOAL_CHECKPOINT_LEASE_RESTORE_H_
