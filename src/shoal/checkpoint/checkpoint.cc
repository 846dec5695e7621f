#include "shoal/checkpoint/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "shoal/core/file.h"
#include "shoal/core/status.h"
#include "shoal/server/data_leases.h"

namespace shoal {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CheckpointIndex::Part, shard, stored_name, row_begin, row_end)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CheckpointIndex::Variable, name, shape, parts)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CheckpointIndex, format_version, step, shards, tasks, variables)

namespace {

namespace fs = std::filesystem;
constexpr char kIndexFile[] = "index.json";

// The checkpoints this process is restoring from (CheckpointInUse), as
// CanonicalPath gives them; several restores may hold one.
absl::Mutex in_use_mu(absl::kConstInit);
std::multiset<std::string>& InUse() ABSL_EXCLUSIVE_LOCKS_REQUIRED(in_use_mu) {
  static auto* in_use = new std::multiset<std::string>();
  return *in_use;
}

std::string CanonicalPath(const std::string& path) {
  std::error_code error;
  const fs::path canonical = fs::weakly_canonical(fs::absolute(path), error);
  return error ? path : canonical.string();
}

// A task's watermarks in the index: {"exact": bool, "variables": [[epoch,
// shard, watermark], ...], "tables": {"name": [[epoch, shard, watermark],
// ...]}}.
nlohmann::json MarkList(const google::protobuf::RepeatedPtrField<wire::ShardMark>& marks) {
  nlohmann::json list = nlohmann::json::array();
  for (const wire::ShardMark& mark : marks) list.push_back({mark.epoch(), mark.shard(), mark.watermark()});
  return list;
}

void ReadMarkList(const nlohmann::json& list, google::protobuf::RepeatedPtrField<wire::ShardMark>* marks) {
  for (const nlohmann::json& entry : list) {
    const auto numbers = entry.get<std::vector<int64_t>>();
    if (numbers.size() != 3) {
      throw nlohmann::json::type_error::create(302, "a watermark is [epoch, shard, place]", &entry);
    }
    wire::ShardMark* mark = marks->Add();
    mark->set_epoch(numbers[0]);
    mark->set_shard(numbers[1]);
    mark->set_watermark(numbers[2]);
  }
}

nlohmann::json MarksToJson(const wire::TaskMarks& marks) {
  nlohmann::json tables = nlohmann::json::object();
  for (const wire::TableMarks& table : marks.tables()) tables[table.table()] = MarkList(table.marks());
  nlohmann::json json = {{"exact", marks.exact()}, {"variables", MarkList(marks.variables())}, {"tables", tables}};
  if (marks.has_step()) json["step"] = marks.step();
  return json;
}

wire::TaskMarks MarksFromJson(const nlohmann::json& json) {
  wire::TaskMarks marks;
  marks.set_exact(json.at("exact").get<bool>());
  if (json.contains("step")) marks.set_step(json.at("step").get<int64_t>());
  ReadMarkList(json.at("variables"), marks.mutable_variables());
  for (const auto& [table, list] : json.at("tables").items()) {
    wire::TableMarks* out = marks.add_tables();
    out->set_table(table);
    ReadMarkList(list, out->mutable_marks());
  }
  return marks;
}

}  // namespace

absl::StatusOr<std::string> SaveCheckpoint(Client& client, const std::string& dir, int64_t step,
                                           const std::vector<std::string>& counters) {
  const std::string folder = fs::absolute(CheckpointFolder(dir, step)).string();
  std::error_code error;
  fs::create_directories(folder, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create checkpoint folder '", folder, "': ", error.message()));

  // One shard per task that holds any variable, in a stable order.
  CheckpointIndex index;
  index.format_version = kCheckpointFormatVersion;
  index.step = step;
  std::map<TaskId, int> shard_of;
  for (const auto& [name, vp] : client.placement().variables()) {
    for (const Shard& shard : vp.shards) shard_of.emplace(shard.task, 0);
  }
  // Every ps task, too: one may hold embedding tables and no variable.
  if (auto ps_tasks = client.TableShards(); ps_tasks.ok()) {
    for (const TaskId& task : *ps_tasks) shard_of.emplace(task, 0);
  }
  int next = 0;
  for (auto& [task, shard] : shard_of) {
    shard = next++;
    index.shards.push_back(ShardFileName(shard));
    index.tasks.push_back(task.ToString());
  }
  // Every task writes its shard at once (a ps task's tables can take
  // seconds), into the same folder of its own checkpoint directory, which
  // must be this one (the same config, a shared file system).
  SHOAL_ASSIGN_OR_RETURN(const wire::LeaseTableState leases, client.LeaseTable());
  if (leases.examples() > 0) index.lease_table = leases;
  const int64_t restarts_before = client.restarts_seen();
  SHOAL_ASSIGN_OR_RETURN(const auto saved_by_task,
                         client.SaveShards(shard_of, step, leases.epochs_done(), kGlobalStep));
  // A task that restarted meanwhile wrote what it held then: nothing, or a
  // restore's older values beside the others' live ones.
  if (client.restarts_seen() != restarts_before) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint at step ", step, ": a task restarted while it was saved; the checkpoint is left unfinished"));
  }
  std::map<TaskId, std::set<std::string>> stored;
  for (const auto& [task, shard] : shard_of) {
    const Client::SavedShard& saved = saved_by_task.at(task);
    const fs::path expected = fs::path(folder) / index.shards[shard];
    std::error_code same_error;
    if (!fs::equivalent(expected, saved.path, same_error)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint at step ", step, ": ", task.ToString(), " wrote its shard to '", saved.path,
          "', which is not '", expected.string(), "'; every task needs the same checkpoint.dir (on a shared file system)"));
    }
    stored[task].insert(saved.names.begin(), saved.names.end());
    if (saved.wrote_tables) index.table_shards.push_back(shard);
  }
  if (index.lease_table.has_value()) {
    // Each shard's watermarks, taken with its snapshot. A save that ran for
    // more epochs than a restored table can hold open is not kept.
    for (const auto& [task, shard] : shard_of) index.lease_marks.push_back(saved_by_task.at(task).marks);
    const int64_t last_open = index.lease_table->epochs_done() + DataLeases::kMaxRestoredEpochs - 1;
    int64_t last_marked = 0;
    for (const wire::TaskMarks& marks : index.lease_marks) {
      for (const auto& mark : marks.variables()) last_marked = std::max(last_marked, mark.epoch());
      for (const auto& table : marks.tables()) {
        for (const auto& mark : table.marks()) last_marked = std::max(last_marked, mark.epoch());
      }
    }
    if (last_marked > last_open) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint at step ", step, ": the data moved from epoch ", index.lease_table->epochs_done(), " to epoch ",
          last_marked, " while the shards were written; the checkpoint is left unfinished"));
    }
  }
  // Every ps task holds a shard of each table: one that wrote none has lost
  // its tables (restarted, not yet restored).
  if (!index.table_shards.empty()) {
    for (const auto& [task, shard] : shard_of) {
      if (task.job != "ps" || saved_by_task.at(task).wrote_tables) continue;
      return absl::FailedPreconditionError(absl::StrCat("checkpoint at step ", step, ": ", task.ToString(),
                                                        " holds no embedding table while the other ps tasks do (lost, "
                                                        "not restored yet?); the checkpoint is left unfinished"));
    }
  }
  for (const auto& [name, vp] : client.placement().variables()) {
    CheckpointIndex::Variable v{name, vp.shape, {}};
    for (const Shard& shard : vp.shards) {
      if (!stored[shard.task].count(shard.stored_name)) {
        return absl::FailedPreconditionError(absl::StrCat("checkpoint at step ", step, ": ", shard.task.ToString(),
                                                          " does not hold '", shard.stored_name,
                                                          "' (not created yet?); the checkpoint is left unfinished"));
      }
      const int64_t rows = vp.shape.empty() ? 0 : vp.shape[0];
      v.parts.push_back({shard_of[shard.task], shard.stored_name, vp.partitioned() ? shard.row_begin : 0,
                         vp.partitioned() ? shard.row_end : rows});
    }
    index.variables.push_back(std::move(v));
  }
  for (const std::string& name : counters) {
    SHOAL_ASSIGN_OR_RETURN(index.counters[name], client.AddToCounter(name, 0));
  }
  nlohmann::json text = index;
  text["counters"] = index.counters;  // optional: older indexes have none
  if (!index.table_shards.empty()) text["table_shards"] = index.table_shards;  // optional, as counters
  if (index.lease_table.has_value()) {
    const wire::LeaseTableState& table = *index.lease_table;
    text["lease_table"] = {{"data_fingerprint", table.data_fingerprint()},
                           {"examples", table.examples()},
                           {"shard_examples", table.shard_examples()},
                           {"epochs_done", table.epochs_done()},
                           {"shard_offsets", std::vector<int64_t>(table.shard_offsets().begin(),
                                                                  table.shard_offsets().end())}};
    nlohmann::json& marks = text["lease_table"]["shard_marks"] = nlohmann::json::array();
    for (const wire::TaskMarks& shard : index.lease_marks) marks.push_back(MarksToJson(shard));
  }
  // The index last: until it is in place, this checkpoint does not exist.
  SHOAL_RETURN_IF_ERROR(WriteFileAtomically((fs::path(folder) / kIndexFile).string(), text.dump(1)));
  return folder;
}

std::vector<CheckpointInfo> ListCheckpoints(const std::string& dir) {
  std::vector<CheckpointInfo> found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    int64_t step = 0;
    if (!entry.is_directory() || name.rfind(kCheckpointFolderPrefix, 0) != 0 ||
        !absl::SimpleAtoi(name.substr(std::strlen(kCheckpointFolderPrefix)), &step)) continue;
    const absl::StatusOr<CheckpointIndex> index = ReadCheckpointIndex(entry.path().string());
    CheckpointInfo info{entry.path().string(), step, index.ok(), ""};
    if (!index.ok() && !absl::IsNotFound(index.status())) info.corrupt = std::string(index.status().message());
    found.push_back(info);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return found;
}

absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir, bool fall_back_past_corrupt) {
  const std::vector<CheckpointInfo> all = ListCheckpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->complete) return it->path;
    if (it->corrupt.empty()) continue;  // unfinished: never counted
    if (!fall_back_past_corrupt) {
      return absl::DataLossError(absl::StrCat(it->corrupt, "; set checkpoint.on_corrupt: fall_back to start from "
                                              "the newest intact checkpoint instead"));
    }
    absl::FPrintF(stderr, "shoal: warning: skipping a damaged checkpoint: %s\n", it->corrupt);
  }
  return absl::NotFoundError(absl::StrCat("no complete checkpoint under '", dir, "'"));
}

absl::Status PruneCheckpoints(const std::string& dir, int keep) {
  std::vector<CheckpointInfo> all = ListCheckpoints(dir);
  int complete_seen = 0;
  bool newer_complete = false;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const bool drop = it->complete ? ++complete_seen > keep : newer_complete;
    newer_complete = newer_complete || it->complete;
    if (!drop) continue;
    const std::string path = CanonicalPath(it->path);
    absl::MutexLock lock(&in_use_mu);  // no restore marks it between the look and the removal
    if (InUse().count(path) > 0) continue;
    std::error_code error;
    fs::remove_all(it->path, error);
    if (error) return absl::InternalError(absl::StrCat("cannot remove checkpoint '", it->path, "': ", error.message()));
  }
  return absl::OkStatus();
}

CheckpointInUse::CheckpointInUse(std::string checkpoint)
    : path_(std::move(checkpoint)), checkpoint_(CanonicalPath(path_)) {
  absl::MutexLock lock(&in_use_mu);
  InUse().insert(checkpoint_);
}

CheckpointInUse::~CheckpointInUse() {
  absl::MutexLock lock(&in_use_mu);
  InUse().erase(InUse().find(checkpoint_));
}

bool CheckpointInUse::Held(const std::string& checkpoint) {
  const std::string path = CanonicalPath(checkpoint);
  absl::MutexLock lock(&in_use_mu);
  return InUse().count(path) > 0;
}

absl::StatusOr<std::unique_ptr<CheckpointInUse>> HoldLatestCheckpoint(const std::string& dir,
                                                                      bool fall_back_past_corrupt) {
  // Pruning removes a checkpoint only once a newer one is complete, and
  // never while one holds it: one removed between the choice and the mark
  // leaves a newer one to take instead.
  for (int attempt = 1;; ++attempt) {
    SHOAL_ASSIGN_OR_RETURN(const std::string latest, LatestCheckpoint(dir, fall_back_past_corrupt));
    auto held = std::make_unique<CheckpointInUse>(latest);
    if (ReadCheckpointIndex(latest).ok() || attempt == 3) return held;
  }
}

absl::StatusOr<CheckpointIndex> ReadCheckpointIndex(const std::string& checkpoint) {
  const std::string path = (fs::path(checkpoint) / kIndexFile).string();
  SHOAL_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, "checkpoint index"));
  CheckpointIndex index;
  try {
    const nlohmann::json json = nlohmann::json::parse(text);
    index = json.get<CheckpointIndex>();
    if (json.contains("counters")) index.counters = json["counters"].get<std::map<std::string, int64_t>>();
    if (json.contains("table_shards")) index.table_shards = json["table_shards"].get<std::vector<int>>();
    if (json.contains("lease_table")) {
      const nlohmann::json& table = json["lease_table"];
      wire::LeaseTableState state;
      state.set_data_fingerprint(table.at("data_fingerprint").get<int64_t>());
      state.set_examples(table.at("examples").get<int64_t>());
      state.set_shard_examples(table.at("shard_examples").get<int64_t>());
      state.set_epochs_done(table.at("epochs_done").get<int64_t>());
      for (int64_t offset : table.at("shard_offsets").get<std::vector<int64_t>>()) state.add_shard_offsets(offset);
      index.lease_table = std::move(state);
      if (table.contains("shard_marks")) {  // optional: older indexes have none
        for (const nlohmann::json& shard : table.at("shard_marks")) index.lease_marks.push_back(MarksFromJson(shard));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat("checkpoint index '", path, "' is corrupt: ", e.what()));
  }
  if (index.format_version != static_cast<int>(kCheckpointFormatVersion)) {
    return absl::DataLossError(absl::StrCat("checkpoint index '", path, "' has format version ", index.format_version,
                                            "; this shoal reads version ", kCheckpointFormatVersion));
  }
  for (const auto& v : index.variables) {
    for (const auto& part : v.parts) {
      if (part.shard < 0 || part.shard >= static_cast<int>(index.shards.size())) {
        return absl::DataLossError(absl::StrCat("checkpoint index '", path, "': variable '", v.name,
                                                "' names shard ", part.shard, " of ", index.shards.size()));
      }
    }
  }
  return index;
}

absl::StatusOr<std::vector<CheckpointVariable>> LoadCheckpoint(const std::string& checkpoint,
                                                               CheckpointIndex* index_out) {
  SHOAL_ASSIGN_OR_RETURN(CheckpointIndex index, ReadCheckpointIndex(checkpoint));
  if (index_out != nullptr) *index_out = index;
  std::vector<std::map<std::string, SavedVariable>> shards;
  for (const std::string& file : index.shards) {
    SHOAL_ASSIGN_OR_RETURN(std::vector<SavedVariable> saved, ReadShard((fs::path(checkpoint) / file).string()));
    std::map<std::string, SavedVariable> by_name;
    for (auto& v : saved) by_name.emplace(v.name, std::move(v));
    shards.push_back(std::move(by_name));
  }
  std::vector<CheckpointVariable> variables;
  for (const auto& v : index.variables) {
    CheckpointVariable out{v.name, v.shape, {}, {}, {}};
    std::vector<std::vector<torch::Tensor>> pieces;  // [tensor][part]: the value, then each slot
    for (const auto& part : v.parts) {
      auto found = shards[part.shard].find(part.stored_name);
      if (found == shards[part.shard].end()) {
        return absl::DataLossError(absl::StrCat("checkpoint '", checkpoint, "': shard '", index.shards[part.shard],
                                                "' lacks '", part.stored_name, "' of variable '", v.name, "'"));
      }
      const SavedVariable& saved = found->second;
      std::vector<torch::Tensor> tensors = {saved.value};
      tensors.insert(tensors.end(), saved.slots.tensors.begin(), saved.slots.tensors.end());
      if (!pieces.empty() && pieces.size() != tensors.size()) {
        return absl::DataLossError(absl::StrCat("checkpoint '", checkpoint, "': the parts of variable '", v.name,
                                                "' have different slots"));
      }
      pieces.resize(tensors.size());
      for (size_t t = 0; t < tensors.size(); ++t) pieces[t].push_back(tensors[t]);
      out.slots.step = saved.slots.step;
      out.optimizer = saved.optimizer;
    }
    for (size_t t = 0; t < pieces.size(); ++t) {
      torch::Tensor whole = pieces[t].size() == 1 ? pieces[t][0] : torch::cat(pieces[t], 0);
      if (whole.sizes() != c10::IntArrayRef(v.shape)) {
        return absl::DataLossError(absl::StrCat("checkpoint '", checkpoint, "': variable '", v.name, "' has shape [",
                                                absl::StrJoin(whole.sizes(), ","), "] in its shards but [",
                                                absl::StrJoin(v.shape, ","), "] in the index"));
      }
      if (t == 0) {
        out.value = whole;
      } else {
        out.slots.tensors.push_back(whole);
      }
    }
    variables.push_back(std::move(out));
  }
  return variables;
}

absl::StatusOr<std::vector<CheckpointVariable>> SelectVariables(std::vector<CheckpointVariable> all,
                                                                const std::vector<std::string>& names,
                                                                const std::vector<std::vector<int64_t>>& shapes,
                                                                const std::string& checkpoint) {
  std::map<std::string, CheckpointVariable*> by_name;
  for (auto& v : all) by_name[v.name] = &v;
  std::vector<CheckpointVariable> selected;
  for (size_t i = 0; i < names.size(); ++i) {
    auto found = by_name.find(names[i]);
    if (found == by_name.end()) {
      return absl::NotFoundError(absl::StrCat("checkpoint '", checkpoint, "' has no variable '", names[i], "'"));
    }
    if (found->second->shape != shapes[i]) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint '", checkpoint, "': variable '", names[i],
                                                     "' has shape [", absl::StrJoin(found->second->shape, ","),
                                                     "], the model's is [", absl::StrJoin(shapes[i], ","), "]"));
    }
    selected.push_back(std::move(*found->second));
  }
  return selected;
}

absl::StatusOr<std::vector<CheckpointVariable>> LoadVariables(const std::string& checkpoint,
                                                              const std::vector<std::string>& names,
                                                              const std::vector<std::vector<int64_t>>& shapes,
                                                              CheckpointIndex* index) {
  SHOAL_ASSIGN_OR_RETURN(std::vector<CheckpointVariable> all, LoadCheckpoint(checkpoint, index));
  return SelectVariables(std::move(all), names, shapes, checkpoint);
}

absl::Status RestoreVariables(Client& client, const std::vector<CheckpointVariable>& variables,
                              const std::vector<std::string>& names, std::optional<int64_t> accumulator_step) {
  std::vector<torch::Tensor> values;
  std::vector<OptimizerSlots> slots;
  for (const auto& v : variables) {
    values.push_back(v.value);
    slots.push_back(v.slots);
  }
  SHOAL_RETURN_IF_ERROR(client.Assign(names, values, accumulator_step));
  return client.AssignSlots(names, slots);
}

absl::StatusOr<std::string> CheckpointAt(const std::string& path) {
  if (ReadCheckpointIndex(path).ok()) return path;
  return LatestCheckpoint(path);
}

}  // namespace shoal
