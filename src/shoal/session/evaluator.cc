#include "shoal/session/evaluator.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/core/status.h"
#include "shoal/strategy/training_mode.h"

namespace shoal {

absl::Status CheckEvaluatorConfig(const JobConfig& config) {
  if (config.checkpoint.dir.empty()) {
    return absl::FailedPreconditionError(
        "an evaluator task evaluates the chief's checkpoints: set checkpoint.dir (a folder every task can read)");
  }
  SHOAL_ASSIGN_OR_RETURN(const TrainingMode* mode, FindMode(config.training.mode));
  if (!mode->TrainsOneModel()) {
    return absl::FailedPreconditionError(absl::StrCat("an evaluator task evaluates one model per checkpoint; mode '",
                                                      config.training.mode,
                                                      "' trains several (its chief reports each)"));
  }
  if (config.model.kind == "click") {
    return absl::FailedPreconditionError(
        "an evaluator task evaluates checkpoints by itself, without ps tasks, and does not load a click model's "
        "tables (the chief evaluates the live tables at the end)");
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointEvaluation> EvaluateCheckpoint(const JobConfig& config, const std::string& checkpoint,
                                                        const Dataset& test_set) {
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> built, MakeModel(config.model));
  Model& model = *built;
  // The variables, then the buffers (BatchNorm statistics) saved beside them.
  CheckpointIndex index;
  SHOAL_ASSIGN_OR_RETURN(std::vector<CheckpointVariable> all, LoadCheckpoint(checkpoint, &index));
  SHOAL_ASSIGN_OR_RETURN(std::vector<CheckpointVariable> chosen,
                         SelectVariables(std::move(all), model.StateNames(), model.StateShapes(), checkpoint));
  std::vector<torch::Tensor> values;
  for (auto& v : chosen) values.push_back(v.value);
  model.LoadState(values);
  model.SetTraining(false);
  CheckpointEvaluation result;
  result.checkpoint = checkpoint;
  result.global_step = index.step;
  SHOAL_ASSIGN_OR_RETURN(const Evaluation figures, Evaluate(model, test_set));
  result.test_accuracy = figures.accuracy;
  result.test_loss = figures.loss;
  return result;
}

std::string EvaluationJsonLine(const std::string& task, const CheckpointEvaluation& evaluation) {
  nlohmann::json line = {{"task", task},
                         {"global_step", evaluation.global_step},
                         {"test_accuracy", evaluation.test_accuracy},
                         {"test_loss", evaluation.test_loss},
                         {"checkpoint", evaluation.checkpoint},
                         {"unix_time", absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch())}};
  return line.dump();
}

}  // namespace shoal
