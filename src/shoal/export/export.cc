#include "shoal/export/export.h"

#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/core/status.h"
#include "shoal/data/npy.h"
#include "shoal/export/model_files.h"
#include "shoal/model/click_model.h"
#include "shoal/server/table_checkpoint.h"
#include "shoal/strategy/training_mode.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;

// The checkpoint folder `options` names.
absl::StatusOr<std::string> ChooseCheckpoint(const ExportOptions& options) {
  if (options.checkpoint.empty()) return absl::InvalidArgumentError("export: no checkpoint given (--checkpoint DIR)");
  if (options.step < 0) return CheckpointAt(options.checkpoint);
  std::vector<std::string> steps;
  for (const CheckpointInfo& info : ListCheckpoints(options.checkpoint)) {
    if (!info.complete) continue;
    if (info.step == options.step) return info.path;
    steps.push_back(absl::StrCat(info.step));
  }
  return absl::NotFoundError(absl::StrCat("no complete checkpoint of step ", options.step, " under '",
                                          options.checkpoint, "'; its steps: ",
                                          steps.empty() ? "none" : absl::StrJoin(steps, ", ")));
}

// One table's NPY pairs, a pair per shard file, as they are written.
struct TableFiles {
  int64_t width = 0;
  std::vector<nlohmann::json> shards;
  std::unique_ptr<NpyAppender> ids, rows;
  int64_t total = 0;
};

absl::Status CloseShard(TableFiles& files, const fs::path& folder, const std::string& name, int shard) {
  if (files.ids == nullptr) return absl::OkStatus();
  SHOAL_RETURN_IF_ERROR(files.ids->Finish());
  SHOAL_RETURN_IF_ERROR(files.rows->Finish());
  files.shards.push_back({{"ids", absl::StrCat(name, "/shard-", shard, ".ids.npy")},
                          {"rows", absl::StrCat(name, "/shard-", shard, ".rows.npy")},
                          {"count", files.ids->rows()}});
  files.total += files.ids->rows();
  files.ids.reset();
  files.rows.reset();
  return absl::OkStatus();
}

// Streams the checkpoint's table files into NPY pairs under `folder`, one
// chunk in memory at a time; returns the manifest's "tables".
absl::StatusOr<nlohmann::json> WriteTables(const std::string& checkpoint, const CheckpointIndex& index,
                                           const std::vector<wire::TableDef>& defs, const fs::path& folder,
                                           std::vector<ExportedTable>* exported) {
  std::map<std::string, TableFiles> tables;
  for (int shard : index.table_shards) {
    const std::string file = (fs::path(checkpoint) / TableFileName(shard)).string();
    SHOAL_RETURN_IF_ERROR(ReadTableCheckpoint(file, [&](const TableChunkData& chunk) -> absl::Status {
      if (chunk.rows.sightings()) return absl::OkStatus();  // ids seen too rarely to have rows
      const std::string& name = chunk.header.table();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
        return absl::DataLossError(absl::StrCat(file, ": a table named '", name, "' cannot be a folder's name"));
      }
      TableFiles& files = tables[name];
      if (files.ids == nullptr) {
        files.width = chunk.header.dim();
        std::error_code error;
        fs::create_directories(folder / name, error);
        if (error) return absl::InternalError(absl::StrCat("cannot create '", (folder / name).string(), "'"));
        const fs::path stem = folder / name / absl::StrCat("shard-", shard);
        SHOAL_ASSIGN_OR_RETURN(files.ids, NpyAppender::Open(stem.string() + ".ids.npy", torch::kInt64, {}));
        SHOAL_ASSIGN_OR_RETURN(files.rows, NpyAppender::Open(stem.string() + ".rows.npy", torch::kFloat32, {files.width}));
      }
      SHOAL_RETURN_IF_ERROR(files.ids->Append(chunk.rows.ids));
      return files.rows->Append(chunk.rows.values);
    }));
    for (auto& [name, files] : tables) SHOAL_RETURN_IF_ERROR(CloseShard(files, folder, name, shard));
  }
  nlohmann::json manifest = nlohmann::json::array();
  for (auto& [name, files] : tables) {
    nlohmann::json entry = {{"name", name}, {"width", files.width}, {"rows", files.total}, {"shards", files.shards}};
    for (const wire::TableDef& def : defs) {
      if (def.name() != name) continue;
      // How the model reaches rows the table does not hold (an unseen id of
      // a dynamic table): their initial values, drawn from (seed, id).
      entry["rows_configured"] = def.rows();
      entry["seed"] = def.seed();
      entry["init_scale"] = def.init_scale();
    }
    manifest.push_back(std::move(entry));
    exported->push_back({name, files.width, files.total, static_cast<int>(files.shards.size())});
  }
  return manifest;
}

// What serving needs to know of a click model beyond its tables.
nlohmann::json ClickManifest(const ClickConfig& click) {
  return {{"arch", click.arch},
          {"dim", click.dim},
          {"wide_column", click.arch == "wide_deep"},
          {"integer_features", click.integer_features},
          {"categorical_features", click.categorical_features},
          {"bag_size", click.bag_size},
          {"pooling", click.pooling}};
}

// The checkpoint's tables and their manifest in a fresh folder beside
// `tables_folder`, to be renamed into place once the model file is written
// too; on failure nothing is left.
absl::StatusOr<fs::path> BuildTablesFolder(const JobConfig& config, const std::string& checkpoint,
                                           const CheckpointIndex& index, const fs::path& tables_folder,
                                           std::vector<ExportedTable>* exported) {
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, MakeModel(config.model));
  const fs::path building = absl::StrCat(tables_folder.string(), ".tmp-", getpid());
  std::error_code error;
  fs::remove_all(building, error);
  fs::create_directories(building, error);
  if (error) return absl::InternalError(absl::StrCat("export: cannot create '", building.string(), "'"));
  auto tables = WriteTables(checkpoint, index, model->row_tables()->TableDefs(), building, exported);
  absl::Status written = tables.status();
  if (written.ok() && exported->empty()) {
    written = absl::NotFoundError(absl::StrCat("checkpoint ", checkpoint, " holds no table rows for the click model"));
  }
  if (written.ok()) {
    const nlohmann::json manifest = {{"format", "shoal-tables-1"},
                                     {"checkpoint", checkpoint},
                                     {"global_step", index.step},
                                     {"tables", *tables},
                                     {"click", ClickManifest(config.model.click)},
                                     {"optimizer_state", "left out"}};
    written = WriteTextFile((building / "manifest.json").string(), manifest.dump(2) + "\n");
  }
  if (!written.ok()) {
    fs::remove_all(building, error);
    return Annotate(written, "export of the tables");
  }
  return building;
}

}  // namespace

absl::StatusOr<ExportResult> ExportCheckpoint(const JobConfig& config, const ExportOptions& options) {
  if (options.out.empty()) return absl::InvalidArgumentError("export: no output file given (--out model.pt)");
  const fs::path out(options.out);
  const fs::path out_folder = out.has_parent_path() ? out.parent_path() : ".";
  std::error_code error;
  if (!fs::is_directory(out_folder, error)) {
    return absl::NotFoundError(absl::StrCat("export: the folder of --out '", options.out, "', '",
                                            out_folder.string(), "', does not exist"));
  }
  const bool has_tables = config.model.kind == "click";
  const fs::path tables_folder = options.tables_dir.empty() ? out_folder / "tables" : fs::path(options.tables_dir);
  if (has_tables && fs::exists(tables_folder, error) && !fs::is_empty(tables_folder, error) &&
      !fs::exists(tables_folder / "manifest.json", error)) {
    return absl::AlreadyExistsError(absl::StrCat("export: '", tables_folder.string(),
                                                 "' holds files that are not an export's tables; name another "
                                                 "folder with --tables_dir"));
  }
  SHOAL_ASSIGN_OR_RETURN(const TrainingMode* mode, FindMode(config.training.mode));
  ExportResult result;
  SHOAL_ASSIGN_OR_RETURN(result.checkpoint, ChooseCheckpoint(options));
  const std::string& checkpoint = result.checkpoint;
  CheckpointIndex index;
  auto loaded = LoadCheckpoint(checkpoint, &index);  // every checksum checked
  if (!loaded.ok()) return Annotate(loaded.status(), absl::StrCat("export of checkpoint ", checkpoint));
  result.step = index.step;
  std::map<std::string, torch::Tensor> saved;
  for (CheckpointVariable& variable : *loaded) saved[variable.name] = std::move(variable.value);
  const ReadTensors read = [&saved, &checkpoint](const std::vector<std::string>& names)
      -> absl::StatusOr<std::vector<torch::Tensor>> {
    std::vector<torch::Tensor> values;
    for (const std::string& name : names) {
      auto it = saved.find(name);
      if (it == saved.end()) {
        return absl::NotFoundError(absl::StrCat("holds no variable '", name,
                                                "', which the configured model has: it is another model's checkpoint"
                                                " (or give the config it was trained with)"));
      }
      values.push_back(it->second);
    }
    return values;
  };
  auto final_model = mode->Final(config, config.cluster.workers, read, options.member);
  if (!final_model.ok()) return Annotate(final_model.status(), absl::StrCat("checkpoint ", checkpoint));
  if (!final_model->script.ok()) return Annotate(final_model->script.status(), "export");
  result.member = final_model->member;

  // The tables first, into a folder of their own that is renamed into
  // place: a damaged table file leaves no model file and no tables.
  fs::path building;
  if (has_tables) {
    SHOAL_ASSIGN_OR_RETURN(building, BuildTablesFolder(config, checkpoint, index, tables_folder, &result.tables));
  }
  absl::Status saved_model = SaveScriptFile(*final_model->script, options.out);
  if (!saved_model.ok()) {
    fs::remove_all(building, error);
    return saved_model;
  }
  result.model_file = options.out;
  if (has_tables) {
    fs::remove_all(tables_folder, error);  // an earlier export's (checked above)
    fs::rename(building, tables_folder, error);
    if (error) {
      return absl::InternalError(absl::StrCat("export: cannot rename '", building.string(), "' to '",
                                              tables_folder.string(), "': ", error.message()));
    }
    result.tables_dir = tables_folder.string();
  }
  return result;
}

}  // namespace shoal
