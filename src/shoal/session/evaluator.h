// The evaluator task (TensorFlow's, and the Kubeflow TFJob's `evaluator`
// replica): it trains nothing; it evaluates each new checkpoint the chief
// saves on the test set and writes the results as metrics.
#ifndef SHOAL_SESSION_EVALUATOR_H_
#define SHOAL_SESSION_EVALUATOR_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "shoal/config/config.h"
#include "shoal/data/dataset.h"

namespace shoal {

struct CheckpointEvaluation {
  std::string checkpoint;
  int64_t global_step = 0;
  double test_accuracy = 0;
  double test_loss = 0;  // the model's mean loss (click models: log loss)
  std::optional<double> test_auc;  // click models
  int64_t table_rows = 0;  // click models: the table rows restored, those the test set reads
};

// Loads the configured model's variables from `checkpoint` (checking every
// checksum) and evaluates them on `test_set`. A click model's tables come
// from the table shards saved beside the variables: this process serves
// them to itself (an in-process ps task that restores, read-only and
// without slots, only the rows of the ids `test_set` holds) and the model
// pulls each batch's rows from it as in training.
absl::StatusOr<CheckpointEvaluation> EvaluateCheckpoint(const JobConfig& config, const std::string& checkpoint,
                                                        const Dataset& test_set);

// One JSON line for an evaluator's metrics file.
std::string EvaluationJsonLine(const std::string& task, const CheckpointEvaluation& evaluation);

// Whether an evaluator task can follow `config`'s jobs: one model per
// checkpoint, saved by the chief (checkpoint.dir), not a population or an
// ensemble. FailedPrecondition saying why not.
absl::Status CheckEvaluatorConfig(const JobConfig& config);

}  // namespace shoal

#endif  // SHOAL_SESSION_EVALUATOR_H_
