#include "shoal/session/run_folder.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

namespace {

absl::Status WriteRunFolder(const HooksConfig& hooks, const absl::StatusOr<torch::jit::Module>& script,
                            TrainReport* report) {
  SHOAL_ASSIGN_OR_RETURN(report->run_dir, MakeRunFolder(hooks.run_dir, hooks.run_name));
  const std::filesystem::path folder = report->run_dir;
  SHOAL_RETURN_IF_ERROR(
      SaveWeightsFile({report->trained_names, report->trained_values}, (folder / "weights.pt").string()));
  if (!script.ok()) {
    report->no_model_file = std::string(script.status().message());
    return absl::OkStatus();
  }
  SHOAL_RETURN_IF_ERROR(SaveScriptFile(*script, (folder / "model.pt").string()));
  report->model_file = (folder / "model.pt").string();
  return absl::OkStatus();
}

}  // namespace

void KeepTrainedModel(const HooksConfig& hooks, FinalModel final_model, TrainReport* report) {
  report->trained_names = std::move(final_model.names);
  report->trained_values = std::move(final_model.values);
  report->trained_member = final_model.member;
  if (hooks.run_dir.empty()) return;
  if (absl::Status written = WriteRunFolder(hooks, final_model.script, report); !written.ok()) {
    // The job has trained, and the report still carries the values: a run
    // folder that cannot be written costs the files, not the job.
    absl::FPrintF(stderr, "shoal: warning: the run folder was not written (%s); the report still holds the "
                  "trained values\n", written.ToString());
    report->no_model_file = std::string(written.message());
    report->run_dir.clear();
    report->model_file.clear();
  }
}

void WriteRunReport(const TrainReport& report) {
  if (report.run_dir.empty()) return;
  const std::string text = ReportToJson(report).dump(2) + "\n";
  if (absl::Status written = WriteTextFile((std::filesystem::path(report.run_dir) / "report.json").string(), text);
      !written.ok()) {
    absl::FPrintF(stderr, "shoal: warning: %s\n", written.ToString());
  }
}

}  // namespace shoal
