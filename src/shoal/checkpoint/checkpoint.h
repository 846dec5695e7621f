// Checkpoints of a whole cluster's variables.
//
// A checkpoint is a folder `<dir>/ckpt-<step>/`: one shard per task that
// holds variables, `shard-<i>.ckpt`, written by that task itself
// (server/checkpoint_shard.h), and `index.json`, written last by the chief,
// atomically, which ties the shards to the step and says which stored name
// (and, for a partitioned variable, which rows) holds each variable. A folder
// without a readable index is an unfinished save and is never taken as the
// latest.
//
// Restoring reads the shards on the chief and assigns the variables and their
// optimizer slots through the client, so a checkpoint restores onto any
// placement: another number of ps tasks, partitioned or not.
#ifndef SHOAL_CHECKPOINT_CHECKPOINT_H_
#define SHOAL_CHECKPOINT_CHECKPOINT_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/client/client.h"
#include "shoal/server/checkpoint_shard.h"

namespace shoal {

// The counter of the job's steps, on the counter task. A checkpoint is named
// by its value; on leased data it is also read with the counter task's
// snapshot, and a restore sets it to that (checkpoint/lease_restore.h).
inline constexpr char kGlobalStep[] = "global_step";

// Checkpoints (config `checkpoint:`): the chief saves every variable
// with its optimizer slots under `dir` every `every_steps` global steps or
// `every_seconds` (whichever comes first; with neither set, every 60 s) and
// at the end, keeps the newest `keep`, and restores the newest when a job
// starts on ps tasks that do not hold the variables.
struct CheckpointConfig {
  std::string dir;  // empty: no checkpoints
  int64_t every_steps = 0;
  double every_seconds = 0;
  int keep = 5;
  // When a (re)starting chief restores the newest checkpoint: if_lost, only
  // when the ps tasks lack some variable (live values are newer: nothing is
  // thrown away); always, as TensorFlow's chief does, rolling live ps tasks
  // back to the checkpoint.
  std::string restore = "if_lost";
  // A checkpoint whose index is unreadable: fail (DATA_LOSS naming the file)
  // or fall_back (start from the newest intact one, with a warning).
  std::string on_corrupt = "fail";
  // Whether the chief goes on training while the ps tasks write a
  // checkpoint: auto, as the mode says (yes unless its checkpoints must hold
  // one global step: sync, gated, model_average); true; false, as
  // TensorFlow's saver hook does. One save at a time: one due while another
  // is written starts when it ends.
  std::string background = "auto";
  // How long a task may take to write or read its shard of one (each ps
  // task's tables stream at about 1.5 GB/s here).
  double timeout_s = 1800;
};

struct CheckpointIndex {
  struct Part {
    int shard = 0;  // into `shards`
    std::string stored_name;
    int64_t row_begin = 0;  // rows of the variable this part holds (whole: 0..shape[0])
    int64_t row_end = 0;
  };
  struct Variable {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<Part> parts;
  };
  int format_version = 0;
  int64_t step = 0;
  std::vector<std::string> shards;  // file names in the checkpoint's folder
  std::vector<std::string> tasks;   // the task that wrote each shard
  std::vector<Variable> variables;
  // The job's counters when it was saved (stop flag, workers done, traffic,
  // drops...), so that a lost counter task gets them back.
  std::map<std::string, int64_t> counters;
  // The shards beside which a task wrote its embedding tables
  // (tables-<n>.ckpt, server/table_checkpoint.h); restored by every ps task
  // through Client::RestoreTables.
  std::vector<int> table_shards;
  // Leased data (server/data_leases.h): the lease table when the checkpoint
  // was taken, read before the shards were written, so that a restore
  // trains on from places no later than those the variables hold.
  std::optional<wire::LeaseTableState> lease_table;
  // With it, each shard's watermarks, taken with the shard's snapshot
  // (checkpoint/lease_restore.h), and the counter task's kGlobalStep then;
  // empty in an older checkpoint.
  std::vector<wire::TaskMarks> lease_marks;
};

// A variable as restored: whole, with its optimizer slots.
struct CheckpointVariable {
  std::string name;
  std::vector<int64_t> shape;
  torch::Tensor value;
  OptimizerSlots slots;
  std::string optimizer;
};

struct CheckpointInfo {
  std::string path;
  int64_t step = 0;
  bool complete = false;  // its index is there and readable
  // Why its index is unreadable, when there is one (a save cut short leaves
  // none; the index is written atomically, so an unreadable one is damage).
  std::string corrupt;
};

// Saves every variable of the client's placement at `step` under `dir`
// (made absolute, since the tasks write their shards themselves: `dir` must
// be on a file system they share). Returns the checkpoint's path.
// `counters` are read from the counter task and saved in the index.
absl::StatusOr<std::string> SaveCheckpoint(Client& client, const std::string& dir, int64_t step,
                                           const std::vector<std::string>& counters = {});

// Every ckpt-<step> folder under `dir`, oldest first.
std::vector<CheckpointInfo> ListCheckpoints(const std::string& dir);

// The newest complete checkpoint under `dir`; NotFound if there is none.
// A newer one whose index is corrupt is DATA_LOSS naming the file, unless
// `fall_back_past_corrupt` (checkpoint.on_corrupt: fall_back), which skips
// it with a warning.
absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir, bool fall_back_past_corrupt = false);

// Deletes all but the newest `keep` complete checkpoints, and unfinished
// ones older than the newest complete one; never one this process is
// restoring from (CheckpointInUse).
absl::Status PruneCheckpoints(const std::string& dir, int keep);

// Marks `checkpoint` as being restored by this process for the object's
// life, so that PruneCheckpoints leaves it be: a save ending in the
// background may prune while the chief restores a lost task.
class CheckpointInUse {
 public:
  explicit CheckpointInUse(std::string checkpoint);
  ~CheckpointInUse();
  CheckpointInUse(const CheckpointInUse&) = delete;
  CheckpointInUse& operator=(const CheckpointInUse&) = delete;

  const std::string& path() const { return path_; }  // as given
  static bool Held(const std::string& checkpoint);

 private:
  const std::string path_;
  const std::string checkpoint_;  // as CanonicalPath gives it
};

// LatestCheckpoint, marked in use before it is read (so that a save ending
// meanwhile cannot prune it; one pruned just before the mark gives way to
// the newer one).
absl::StatusOr<std::unique_ptr<CheckpointInUse>> HoldLatestCheckpoint(const std::string& dir,
                                                                      bool fall_back_past_corrupt = false);

absl::StatusOr<CheckpointIndex> ReadCheckpointIndex(const std::string& checkpoint);

// `path` itself if it is a checkpoint (its index reads), else the newest
// complete one under it (LatestCheckpoint).
absl::StatusOr<std::string> CheckpointAt(const std::string& path);

// Reads every shard of `checkpoint`, checking every checksum, and
// reassembles each variable; DataLoss names the file and the variable.
// `index`, if given, receives the index it read.
absl::StatusOr<std::vector<CheckpointVariable>> LoadCheckpoint(const std::string& checkpoint,
                                                               CheckpointIndex* index = nullptr);

// Assigns the values and slots of `variables` (named `names`, in that order)
// through the client: onto whatever placement the client has.
// With `accumulator_step`, their accumulators also start again there.
absl::Status RestoreVariables(Client& client, const std::vector<CheckpointVariable>& variables,
                              const std::vector<std::string>& names,
                              std::optional<int64_t> accumulator_step = std::nullopt);

// The checkpoint's variables named `names`, in that order: NotFound for one
// it lacks, InvalidArgument for another shape than `shapes` says.
absl::StatusOr<std::vector<CheckpointVariable>> SelectVariables(std::vector<CheckpointVariable> all,
                                                                const std::vector<std::string>& names,
                                                                const std::vector<std::vector<int64_t>>& shapes,
                                                                const std::string& checkpoint);

// LoadCheckpoint, then SelectVariables: the variables `names` of
// `checkpoint`, in that order, each checked against its shape in `shapes`.
absl::StatusOr<std::vector<CheckpointVariable>> LoadVariables(const std::string& checkpoint,
                                                              const std::vector<std::string>& names,
                                                              const std::vector<std::vector<int64_t>>& shapes,
                                                              CheckpointIndex* index = nullptr);

}  // namespace shoal

#endif  // SHOAL_CHECKPOINT_CHECKPOINT_H_
