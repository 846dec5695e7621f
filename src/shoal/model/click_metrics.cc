#include "shoal/model/click_metrics.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace shoal {

torch::Tensor ClicksPredictedRight(const torch::Tensor& logits, const torch::Tensor& labels) {
  return logits.reshape(labels.sizes()).gt(0).eq(labels.gt(0.5));
}

absl::StatusOr<ClickMetrics> ComputeClickMetrics(const torch::Tensor& probabilities, const torch::Tensor& labels) {
  if (!probabilities.defined() || !labels.defined() || probabilities.dim() != 1 || labels.dim() != 1 ||
      probabilities.size(0) != labels.size(0)) {
    return absl::InvalidArgumentError("click metrics need [n] probabilities and [n] labels");
  }
  const torch::Tensor p = probabilities.to(torch::kFloat64).contiguous();
  const torch::Tensor y = labels.to(torch::kFloat64).contiguous();
  const int64_t n = p.size(0);
  const double positives = y.sum().item<double>();
  if (positives == 0 || positives == n) {
    return absl::FailedPreconditionError(
        absl::StrCat("AUC needs both classes; all ", n, " labels are ", positives == 0 ? "0" : "1"));
  }
  ClickMetrics metrics;
  const torch::Tensor clipped = p.clamp(1e-7, 1 - 1e-7);
  metrics.log_loss = -(y * clipped.log() + (1 - y) * (1 - clipped).log()).mean().item<double>();
  // Mann-Whitney: the positives' rank sum, ties given their average rank.
  const torch::Tensor order = std::get<1>(p.sort());
  const double* score = p.data_ptr<double>();
  const double* label = y.data_ptr<double>();
  const int64_t* index = order.data_ptr<int64_t>();
  double rank_sum = 0;
  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    while (j + 1 < n && score[index[j + 1]] == score[index[i]]) ++j;
    const double average_rank = (i + j) / 2.0 + 1;  // ranks from 1
    for (int64_t k = i; k <= j; ++k) rank_sum += label[index[k]] * average_rank;
    i = j + 1;
  }
  const double negatives = n - positives;
  metrics.auc = (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
  return metrics;
}

}  // namespace shoal
