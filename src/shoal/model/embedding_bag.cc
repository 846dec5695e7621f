#include "shoal/model/embedding_bag.h"

#include <torch/torch.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "shoal/client/client.h"
#include "shoal/core/status.h"
#include "shoal/model/model.h"

namespace shoal {

RowCache::RowCache(int64_t capacity, int64_t dim, int64_t staleness)
    : capacity_(capacity),
      staleness_(staleness),
      rows_(torch::empty({capacity, dim})),
      slot_id_(capacity, -1),
      slot_step_(capacity, 0) {
  slot_of_.reserve(static_cast<size_t>(capacity));
}

torch::Tensor RowCache::Lookup(const torch::Tensor& ids, int64_t step, torch::Tensor& rows) {
  const int64_t n = ids.numel();
  torch::Tensor hit = torch::zeros({n}, torch::kBool);
  std::vector<int64_t> from, to;
  const int64_t* id = ids.data_ptr<int64_t>();
  bool* hit_data = hit.data_ptr<bool>();
  for (int64_t i = 0; i < n; ++i) {
    auto found = slot_of_.find(id[i]);
    if (found == slot_of_.end() || slot_step_[found->second] + staleness_ < step) continue;
    hit_data[i] = true;
    from.push_back(found->second);
    to.push_back(i);
  }
  if (!from.empty()) {
    rows.index_copy_(0, torch::tensor(to, torch::kInt64), rows_.index_select(0, torch::tensor(from, torch::kInt64)));
  }
  hits_ += static_cast<int64_t>(from.size());
  lookups_ += n;
  return hit;
}

void RowCache::Insert(const torch::Tensor& ids, const torch::Tensor& rows, int64_t step) {
  const int64_t n = std::min(ids.numel(), capacity_);  // more than fit: keep the first
  const int64_t* id = ids.data_ptr<int64_t>();
  std::vector<int64_t> slots(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    auto [it, added] = slot_of_.try_emplace(id[i], next_slot_);
    if (added) {
      const int64_t slot = next_slot_;
      next_slot_ = (next_slot_ + 1) % capacity_;
      if (slot_id_[slot] >= 0) slot_of_.erase(slot_id_[slot]);  // the ring overwrites the oldest
      slot_id_[slot] = id[i];
    }
    slots[i] = it->second;
    slot_step_[it->second] = step;
  }
  rows_.index_copy_(0, torch::tensor(slots, torch::kInt64), rows.narrow(0, 0, n));
}

RemoteEmbeddingBag::RemoteEmbeddingBag(wire::TableDef table, int64_t bag_size, Pooling pooling,
                                       std::unique_ptr<RowCache> cache)
    : table_(std::move(table)), bag_size_(bag_size), pooling_(pooling), cache_(std::move(cache)) {}

absl::Status RemoteEmbeddingBag::Keys(const torch::Tensor& ids, torch::Tensor* keys, torch::Tensor* present) const {
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
  *present = flat.ge(0);
  *keys = flat.masked_select(*present);
  if (table_.rows() > 0) *keys = keys->remainder(table_.rows());
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> RemoteEmbeddingBag::DistinctKeys(const torch::Tensor& ids) const {
  torch::Tensor keys, present;
  SHOAL_RETURN_IF_ERROR(Keys(ids, &keys, &present));
  return std::get<0>(torch::_unique(keys, /*sorted=*/false));
}

absl::Status RemoteEmbeddingBag::Pull(Client& client, const torch::Tensor& ids) {
  torch::Tensor keys, present;
  SHOAL_RETURN_IF_ERROR(Keys(ids, &keys, &present));
  auto [distinct, inverse] = torch::_unique(keys, /*sorted=*/false, /*return_inverse=*/true);
  const int64_t step = ++pulls_;
  torch::Tensor rows = torch::empty({distinct.numel(), table_.dim()});
  torch::Tensor missed = distinct;
  torch::Tensor missed_at;  // where the missed ids sit in `distinct`; undefined: everywhere
  if (cache_ != nullptr && distinct.numel() > 0) {
    const torch::Tensor hit = cache_->Lookup(distinct, step, rows);
    missed_at = hit.logical_not().nonzero().view({-1});
    missed = distinct.index_select(0, missed_at);
  }
  if (missed.numel() > 0) {
    SHOAL_ASSIGN_OR_RETURN(torch::Tensor pulled, client.PullRows(table_.name(), missed, Client::Ids::kDistinct));
    if (missed_at.defined()) {
      rows.index_copy_(0, missed_at, pulled);
    } else {
      rows = pulled;
    }
    if (cache_ != nullptr) cache_->Insert(missed, pulled, step);
  }
  examples_ = ids.size(0);
  bags_ = ids.size(1) / bag_size_;
  distinct_ids_ = distinct;
  rows_ = rows.detach().requires_grad_(true);
  // Empty slots point one past the rows, at a zero row appended in Pooled().
  slot_rows_ = torch::full({present.numel()}, distinct.numel(), torch::kInt64);
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
  absl::Status pushed = client.PushRows(table_.name(), distinct_ids_, rows_.grad(), Client::Ids::kDistinct);
  rows_.mutable_grad().reset();
  return pushed;
}

}  // namespace shoal
