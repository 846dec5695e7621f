#include "shoal/session/run_folder.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "shoal/core/status.h"
#include "shoal/export/model_files.h"

namespace shoal {
namespace {

// A folder of its own under `parent`: `name`, or the time now, with a
// suffix when a job that ended the same second took it. A named run reuses
// its folder (its files are replaced whole).
absl::StatusOr<std::string> MakeRunFolder(const std::string& parent, const std::string& name) {
  std::error_code error;
  std::filesystem::create_directories(parent, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create hooks.run_dir '", parent, "': ", error.message()));
  if (!name.empty()) {
    const std::filesystem::path named = std::filesystem::path(parent) / name;
    std::filesystem::create_directories(named, error);
    if (error) return absl::InternalError(absl::StrCat("cannot create '", named.string(), "': ", error.message()));
    return named.string();
  }
  const std::string stamp = absl::FormatTime("%Y-%m-%d_%H%M%S", absl::Now(), absl::LocalTimeZone());
  for (int attempt = 1; attempt < 1000; ++attempt) {
    const std::filesystem::path folder =
        std::filesystem::path(parent) / (attempt == 1 ? stamp : absl::StrCat(stamp, "-", attempt));
    if (std::filesystem::create_directory(folder, error)) return folder.string();  // false: taken
    if (error) return absl::InternalError(absl::StrCat("cannot create '", folder.string(), "': ", error.message()));
  }
  return absl::ResourceExhaustedError(absl::StrCat("no free run folder name under '", parent, "' for ", stamp));
}

}  // namespace

absl::Status KeepTrainedModel(const HooksConfig& hooks, FinalModel final_model, TrainReport* report) {
  report->trained_names = std::move(final_model.names);
  report->trained_values = std::move(final_model.values);
  report->trained_member = final_model.member;
  if (hooks.run_dir.empty()) return absl::OkStatus();
  SHOAL_ASSIGN_OR_RETURN(report->run_dir, MakeRunFolder(hooks.run_dir, hooks.run_name));
  const std::filesystem::path folder = report->run_dir;
  SHOAL_RETURN_IF_ERROR(
      SaveWeightsFile({report->trained_names, report->trained_values}, (folder / "weights.pt").string()));
  if (final_model.script.ok()) {
    report->model_file = (folder / "model.pt").string();
    SHOAL_RETURN_IF_ERROR(SaveScriptFile(*final_model.script, report->model_file));
  } else {
    report->no_model_file = std::string(final_model.script.status().message());
  }
  return absl::OkStatus();
}

absl::Status WriteRunReport(const TrainReport& report) {
  if (report.run_dir.empty()) return absl::OkStatus();
  const std::string text = ReportToJson(report).dump(2) + "\n";
  return WriteTextFile((std::filesystem::path(report.run_dir) / "report.json").string(), text);
}

}  // namespace shoal
