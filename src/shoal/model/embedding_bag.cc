#include "shoal/model/embedding_bag.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shoal/client/client.h"
#include "shoal/core/distinct_ids.h"
#include "shoal/core/status.h"
#include "shoal/model/model.h"

namespace shoal {

RowCache::RowCache(int64_t capacity, int64_t dim, int64_t staleness)
    : ways_(std::min(capacity, kWays)),
      sets_((capacity + ways_ - 1) / ways_),
      staleness_(staleness),
      dim_(dim),
      rows_(static_cast<size_t>(sets_ * ways_ * dim)),
      slots_(static_cast<size_t>(sets_ * ways_)) {}

int64_t RowCache::SetStart(int64_t id) const {
  // Fibonacci hashing spreads neighbouring ids; the high half of hash * sets
  // maps it onto [0, sets) without a division.
  const uint64_t hash = static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ULL;
  return static_cast<int64_t>((static_cast<unsigned __int128>(hash) * static_cast<uint64_t>(sets_)) >> 64) * ways_;
}

torch::Tensor RowCache::Lookup(const torch::Tensor& ids, int64_t step, torch::Tensor& rows) {
  const int64_t n = ids.numel();
  torch::Tensor hit = torch::zeros({n}, torch::kBool);
  const torch::Tensor keys = ids.contiguous();
  const int64_t* id = keys.data_ptr<int64_t>();
  bool* hit_data = hit.data_ptr<bool>();
  float* out = rows.data_ptr<float>();
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
  int64_t hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t start = SetStart(id[i]);
    for (int64_t slot = start; slot < start + ways_; ++slot) {
      if (slots_[slot].id != id[i]) continue;
      if (slots_[slot].step + staleness_ >= step) {
        hit_data[i] = true;
        ++hits;
        std::memcpy(out + i * dim_, rows_.data() + slot * dim_, row_bytes);
      }
      break;
    }
  }
  hits_ += hits;
  lookups_ += n;
  return hit;
}

void RowCache::Insert(const torch::Tensor& ids, const torch::Tensor& rows, int64_t step) {
  const int64_t n = ids.numel();
  const torch::Tensor keys = ids.contiguous();
  const int64_t* id = keys.data_ptr<int64_t>();
  const torch::Tensor source = rows.contiguous();
  const float* in = source.data_ptr<float>();
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t start = SetStart(id[i]);
    int64_t chosen = start;  // its own slot if held, else the stalest (a free slot's step 0 precedes every pull)
    for (int64_t slot = start; slot < start + ways_; ++slot) {
      if (slots_[slot].id == id[i]) {
        chosen = slot;
        break;
      }
      if (slots_[slot].step < slots_[chosen].step) chosen = slot;
    }
    slots_[chosen] = Slot{id[i], step};
    std::memcpy(rows_.data() + chosen * dim_, in + i * dim_, row_bytes);
  }
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
  return FindDistinctIds(keys).values;
}

absl::Status RemoteEmbeddingBag::Pull(Client& client, const torch::Tensor& ids) {
  torch::Tensor keys, present;
  SHOAL_RETURN_IF_ERROR(Keys(ids, &keys, &present));
  auto [distinct, inverse] = FindDistinctIds(keys);
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

absl::Status RemoteEmbeddingBag::Push(Client& client, const wire::DataProgress* progress,
                                      wire::ProgressAnswer* answer) {
  const bool has_rows = rows_.defined() && rows_.grad().defined() && distinct_ids_.numel() > 0;
  if (!has_rows && progress == nullptr) return absl::OkStatus();
  absl::Status pushed =
      has_rows ? client.PushRows(table_.name(), distinct_ids_, rows_.grad(), Client::Ids::kDistinct, progress, answer)
               : client.PushRows(table_.name(), torch::empty({0}, torch::kInt64),
                                 torch::empty({0, table_.dim()}, torch::kFloat32), Client::Ids::kDistinct, progress,
                                 answer);
  if (has_rows) rows_.mutable_grad().reset();
  return pushed;
}

}  // namespace shoal
