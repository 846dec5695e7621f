// The metrics of click-through prediction: AUC (the probability that a
// random positive example scores above a random negative one, ties counted
// half) and log loss (mean binary cross-entropy of the predicted
// probabilities, clipped to [1e-7, 1 - 1e-7] as scikit-learn does).
#ifndef SHOAL_MODEL_CLICK_METRICS_H_
#define SHOAL_MODEL_CLICK_METRICS_H_

#include <torch/types.h>

#include "absl/status/statusor.h"

namespace shoal {

struct ClickMetrics {
  double auc = 0;
  double log_loss = 0;
};

// `probabilities` and `labels` (0 or 1): [n] float32 each. AUC needs both
// classes present; an error says which is missing.
absl::StatusOr<ClickMetrics> ComputeClickMetrics(const torch::Tensor& probabilities, const torch::Tensor& labels);

// Whether each logit predicts its 0/1 label (logit > 0: a click), bool [n]:
// a click model's accuracy.
torch::Tensor ClicksPredictedRight(const torch::Tensor& logits, const torch::Tensor& labels);

}  // namespace shoal

#endif  // SHOAL_MODEL_CLICK_METRICS_H_
