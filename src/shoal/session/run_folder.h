// A job's run folder: what a finished job leaves, so that nobody has to know
// about checkpoints to keep a trained model. Under hooks.run_dir (default
// "runs"; empty: none) the chief makes one folder per job, named
// hooks.run_name or the time the job ended ("2026-12-06_201503", with -2,
// -3, ... when that is taken), holding:
//   model.pt     the trained model as TorchScript (export/model_files.h),
//                unless its kind has none (a C++ module): the report says why;
//   weights.pt   every trained tensor by name;
//   report.json  the report, as `--result_file` writes it.
#ifndef SHOAL_SESSION_RUN_FOLDER_H_
#define SHOAL_SESSION_RUN_FOLDER_H_

#include <string>

#include "absl/status/status.h"
#include "shoal/hooks/standard_hooks.h"
#include "shoal/strategy/training_mode.h"

namespace shoal {

// The chief's end: `final_model` into report->trained_*, and with
// hooks.run_dir a new run folder holding model.pt and weights.pt
// (report->run_dir, model_file or no_model_file). A folder that cannot be
// written is a warning on stderr (and no_model_file says why), not a
// failed job: the report still carries the trained values.
void KeepTrainedModel(const HooksConfig& hooks, FinalModel final_model, TrainReport* report);

// report.json in report.run_dir (nothing when it is empty): written once the
// caller has added what it knows (restarts, compute threads); a write that
// fails is a warning.
void WriteRunReport(const TrainReport& report);

}  // namespace shoal

#endif  // SHOAL_SESSION_RUN_FOLDER_H_
