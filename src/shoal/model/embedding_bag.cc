#include "shoal/model/embedding_bag.h"

#include <torch/torch.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "shoal/client/client.h"
#include "shoal/core/status.h"
#include "shoal/model/model.h"

namespace shoal {

RemoteEmbeddingBag::RemoteEmbeddingBag(wire::TableDef table, int64_t bag_size, Pooling pooling)
    : table_(std::move(table)), bag_size_(bag_size), pooling_(pooling) {}

absl::Status RemoteEmbeddingBag::Pull(Client& client, const torch::Tensor& ids) {
  if (ids.dim() != 2 || ids.scalar_type() != torch::kInt64 || ids.size(1) % bag_size_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat("table '", table_.name(), "': the ids must be int64 [N, bags * ",
                                                   bag_size_, "], not ", c10::toString(ids.scalar_type()), " ",
                                                   ShapeString(ids.sizes())));
  }
  const torch::Tensor flat = ids.contiguous().view({-1});
  const torch::Tensor below = flat.lt(-1);
  if (below.any().item<bool>()) {
    const int64_t at = below.nonzero()[0][0].item<int64_t>();
    return absl::InvalidArgumentError(absl::StrCat("table '", table_.name(), "': id ", flat[at].item<int64_t>(),
                                                   " in example ", at / ids.size(1), ", column ", at % ids.size(1),
                                                   " is negative (-1 marks an empty slot)"));
  }
  const torch::Tensor present = flat.ge(0);
  torch::Tensor keys = flat.masked_select(present);
  if (table_.rows() > 0) keys = keys.remainder(table_.rows());
  auto [distinct, inverse] = torch::_unique(keys, /*sorted=*/false, /*return_inverse=*/true);
  torch::Tensor rows;
  if (distinct.numel() == 0) {
    rows = torch::zeros({0, table_.dim()});
  } else {
    SHOAL_ASSIGN_OR_RETURN(rows, client.PullRows(table_.name(), distinct));
  }
  examples_ = ids.size(0);
  bags_ = ids.size(1) / bag_size_;
  distinct_ids_ = distinct;
  rows_ = rows.detach().requires_grad_(true);
  // Empty slots point one past the rows, at a zero row appended in Pooled().
  slot_rows_ = torch::full({flat.numel()}, distinct.numel(), torch::kInt64);
  slot_rows_.masked_scatter_(present, inverse);
  bag_counts_ = present.view({examples_, bags_, bag_size_}).sum(2, /*keepdim=*/true).clamp_min(1).to(torch::kFloat32);
  return absl::OkStatus();
}

torch::Tensor RemoteEmbeddingBag::Pooled() const {
  const torch::Tensor padded = torch::cat({rows_, torch::zeros({1, table_.dim()})});
  torch::Tensor pooled =
      padded.index_select(0, slot_rows_).view({examples_, bags_, bag_size_, table_.dim()}).sum(2);
  if (pooling_ == Pooling::kMean) pooled = pooled / bag_counts_;
  return pooled;
}

absl::Status RemoteEmbeddingBag::Push(Client& client) {
  if (!rows_.defined() || !rows_.grad().defined() || distinct_ids_.numel() == 0) return absl::OkStatus();
  absl::Status pushed = client.PushRows(table_.name(), distinct_ids_, rows_.grad());
  rows_.mutable_grad().reset();
  return pushed;
}

}  // namespace shoal
