#include "shoal/checkpoint/lease_restore.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"
#include "shoal/server/data_leases.h"

namespace shoal {

namespace {

using ShardKey = std::pair<int64_t, int64_t>;  // epoch, shard
using MarkMap = std::map<ShardKey, int64_t>;

MarkMap ToMap(const google::protobuf::RepeatedPtrField<wire::ShardMark>& marks) {
  MarkMap map;
  for (const wire::ShardMark& mark : marks) map[{mark.epoch(), mark.shard()}] = mark.watermark();
  return map;
}

// The open shards of the restored table, with their places.
struct OpenShard {
  ShardKey key;
  int64_t first = 0, end = 0;
  int64_t saved_offset = 0;  // the saved table's (end once finished; the first place in an epoch it had not opened)
};

// `marks` filled in over every open shard: a shard it does not list stands
// at its first place (no update of it had reached the task).
void Complete(const MarkMap& marks, const std::vector<OpenShard>& open,
              google::protobuf::RepeatedPtrField<wire::ShardMark>* out) {
  for (const OpenShard& shard : open) {
    auto found = marks.find(shard.key);
    wire::ShardMark* mark = out->Add();
    mark->set_epoch(shard.key.first);
    mark->set_shard(shard.key.second);
    mark->set_watermark(found != marks.end() ? found->second : shard.first);
  }
}

}  // namespace

absl::StatusOr<LeaseRestore> PlanLeaseRestore(const CheckpointIndex& index, bool same_tasks,
                                              const std::string& checkpoint) {
  LeaseRestore plan;
  if (!index.lease_table.has_value()) return plan;
  const wire::LeaseTableState& saved = *index.lease_table;
  plan.table = saved;
  if (index.lease_marks.empty()) return plan;  // an older checkpoint: the table's offsets stand
  auto corrupt = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("checkpoint '", checkpoint, "': ", what));
  };
  if (index.lease_marks.size() != index.tasks.size()) {
    return corrupt(absl::StrCat("its index lists watermarks for ", index.lease_marks.size(), " shards, not ",
                                index.tasks.size()));
  }
  for (int s : index.table_shards) {
    if (s < 0 || static_cast<size_t>(s) >= index.tasks.size()) {
      return corrupt(absl::StrCat("its index names table shard ", s, " of ", index.tasks.size()));
    }
  }
  const int64_t examples = saved.examples(), shard_examples = saved.shard_examples();
  if (examples <= 0 || shard_examples <= 0) return corrupt("its lease table describes no training set");
  const int64_t per_epoch = (examples + shard_examples - 1) / shard_examples;
  const int64_t first_epoch = saved.epochs_done();
  const int64_t saved_epochs = saved.shard_offsets_size() / per_epoch;
  if (saved.shard_offsets_size() % per_epoch != 0) {
    return corrupt(absl::StrCat("its lease table lists ", saved.shard_offsets_size(), " shards, not whole epochs of ",
                                per_epoch));
  }

  // Every mark must name a shard and a place of it, in an epoch the table
  // had open or one opened while the save ran.
  int64_t last_epoch = first_epoch + saved_epochs - 1;
  auto check = [&](const wire::ShardMark& mark, const std::string& where) -> absl::Status {
    const int64_t first = mark.shard() * shard_examples;
    if (mark.epoch() < first_epoch || mark.epoch() >= first_epoch + DataLeases::kMaxRestoredEpochs ||
        mark.shard() < 0 || mark.shard() >= per_epoch || mark.watermark() < first ||
        mark.watermark() > std::min(examples, first + shard_examples)) {
      return corrupt(absl::StrCat(where, " has a watermark at place ", mark.watermark(), " of epoch ", mark.epoch(),
                                  ", shard ", mark.shard(), ", which the lease table (epochs from ", first_epoch,
                                  ", ", per_epoch, " shards of ", shard_examples, ") cannot hold"));
    }
    last_epoch = std::max(last_epoch, mark.epoch());
    return absl::OkStatus();
  };
  for (size_t s = 0; s < index.lease_marks.size(); ++s) {
    const wire::TaskMarks& marks = index.lease_marks[s];
    for (const auto& mark : marks.variables()) SHOAL_RETURN_IF_ERROR(check(mark, index.shards[s]));
    for (const auto& table : marks.tables()) {
      for (const auto& mark : table.marks()) {
        SHOAL_RETURN_IF_ERROR(check(mark, absl::StrCat(index.shards[s], " (table '", table.table(), "')")));
      }
    }
  }

  std::vector<OpenShard> open;
  for (int64_t epoch = first_epoch; epoch <= last_epoch; ++epoch) {
    for (int64_t s = 0; s < per_epoch; ++s) {
      OpenShard shard{{epoch, s}, s * shard_examples, std::min(examples, (s + 1) * shard_examples), 0};
      const int64_t i = (epoch - first_epoch) * per_epoch + s;
      const int64_t offset = epoch < first_epoch + saved_epochs ? saved.shard_offsets(i) : shard.first;
      shard.saved_offset = offset == -1 ? shard.end : offset;
      open.push_back(shard);
    }
  }

  // What each part of the job holds: the variables of each shard that holds
  // some (a task's marks are exact unless a sync gradient was in its
  // accumulators: then the table's offsets stand, as a sync checkpoint
  // holds one step), and each table's rows on each shard that wrote tables
  // (a table it kept no marks for had no rows pushed with places there).
  std::set<size_t> holds_variables;
  for (const auto& variable : index.variables) {
    for (const auto& part : variable.parts) holds_variables.insert(static_cast<size_t>(part.shard));
  }
  const std::set<int> holds_tables(index.table_shards.begin(), index.table_shards.end());
  std::vector<MarkMap> variable_marks;
  std::vector<std::map<std::string, MarkMap>> row_marks;
  std::set<std::string> tables;
  for (const wire::TaskMarks& marks : index.lease_marks) {
    variable_marks.push_back(ToMap(marks.variables()));
    auto& rows = row_marks.emplace_back();
    for (const auto& table : marks.tables()) {
      rows[table.table()] = ToMap(table.marks());
      tables.insert(table.table());
    }
  }
  // The parts: the variables of each shard that holds some, and each
  // table's rows on each table shard (`none`: no marks kept for it there).
  const MarkMap none;
  std::vector<const MarkMap*> variable_parts, exact_variable_parts;
  std::map<std::string, std::vector<const MarkMap*>> row_parts;
  bool offsets_stand = false;
  for (size_t s = 0; s < index.lease_marks.size(); ++s) {
    if (holds_variables.count(s) != 0) {
      variable_parts.push_back(&variable_marks[s]);
      if (index.lease_marks[s].exact()) {
        exact_variable_parts.push_back(&variable_marks[s]);
      } else {
        offsets_stand = true;
      }
    }
    if (holds_tables.count(static_cast<int>(s)) == 0) continue;
    for (const std::string& table : tables) {
      auto found = row_marks[s].find(table);
      row_parts[table].push_back(found != row_marks[s].end() ? &found->second : &none);
    }
  }
  auto held_at = [](const MarkMap& marks, const OpenShard& shard) {
    auto found = marks.find(shard.key);
    return found != marks.end() ? found->second : shard.first;
  };
  auto least_of = [&](const std::vector<const MarkMap*>& of, const OpenShard& shard) {
    int64_t least = shard.end;
    for (const MarkMap* part : of) least = std::min(least, held_at(*part, shard));
    return least;
  };

  if (!offsets_stand) {
    for (const wire::TaskMarks& marks : index.lease_marks) {
      if (marks.has_step()) plan.step = marks.step();
    }
  }

  // Each open shard resumes at the least of what the parts hold, and its
  // batches end at the others' marks.
  plan.table.clear_shard_offsets();
  for (const OpenShard& shard : open) {
    std::set<int64_t> held;
    if (offsets_stand || (exact_variable_parts.empty() && row_parts.empty())) held.insert(shard.saved_offset);
    for (const MarkMap* part : exact_variable_parts) held.insert(held_at(*part, shard));
    for (const auto& [table, parts] : row_parts) {
      for (const MarkMap* part : parts) held.insert(held_at(*part, shard));
    }
    // A shard the table saved finished was applied to its end everywhere.
    const int64_t resume = shard.saved_offset == shard.end ? shard.end : *held.begin();
    plan.table.add_shard_offsets(resume == shard.end ? -1 : resume);
    for (int64_t cut : held) {
      if (cut <= resume || cut >= shard.end) continue;
      wire::ShardMark* out = plan.table.add_cuts();
      out->set_epoch(shard.key.first);
      out->set_shard(shard.key.second);
      out->set_watermark(cut);
    }
  }

  if (same_tasks) {
    for (size_t s = 0; s < index.lease_marks.size(); ++s) {
      wire::TaskMarks& marks = plan.by_task[index.tasks[s]];
      marks.set_exact(index.lease_marks[s].exact());
      Complete(variable_marks[s], open, marks.mutable_variables());
      for (const auto& [table, rows] : row_marks[s]) {
        wire::TableMarks* out = marks.add_tables();
        out->set_table(table);
        Complete(rows, open, out->mutable_marks());
      }
    }
    return plan;
  }
  // The variables and rows now lie elsewhere: every task resumes each shard
  // at the least over the saved shards (parts that were ahead train a few
  // places again).
  wire::TaskMarks& every = plan.every_task.emplace();
  every.set_exact(!offsets_stand);
  MarkMap least_variables;
  std::map<std::string, MarkMap> least_rows;
  for (const OpenShard& shard : open) {
    least_variables[shard.key] = least_of(variable_parts, shard);
    for (const auto& [table, parts] : row_parts) least_rows[table][shard.key] = least_of(parts, shard);
  }
  Complete(least_variables, open, every.mutable_variables());
  for (const auto& [table, rows] : least_rows) {
    wire::TableMarks* out = every.add_tables();
    out->set_table(table);
    Complete(rows, open, out->mutable_marks());
  }
  return plan;
}

}  // namespace shoal
