#include "shoal/core/distinct_ids.h"

#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace shoal {

DistinctIds FindDistinctIds(const torch::Tensor& ids) {
  TORCH_CHECK(ids.scalar_type() == torch::kInt64, "FindDistinctIds: int64 ids, not ", ids.scalar_type());
  const torch::Tensor flat = ids.contiguous().view({-1});
  const int64_t n = flat.numel();
  if (n >= std::numeric_limits<int32_t>::max() / 2) {  // beyond the table's int32 positions
    auto [values, inverse] = torch::_unique(flat, /*sorted=*/false, /*return_inverse=*/true);
    return {values, inverse.view(ids.sizes())};
  }
  // A power of two at least twice the ids: probes stay short, and the table
  // of int32 positions (-1: empty) stays within the core's cache for a batch.
  int bits = 4;
  while ((int64_t{1} << bits) < 2 * n) ++bits;
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  std::vector<int32_t> table(static_cast<size_t>(mask + 1), -1);
  torch::Tensor values = torch::empty({n}, torch::kInt64);
  torch::Tensor inverse = torch::empty({n}, torch::kInt64);
  const int64_t* id = flat.data_ptr<int64_t>();
  int64_t* value = values.data_ptr<int64_t>();
  int64_t* where = inverse.data_ptr<int64_t>();
  int32_t distinct = 0;
  for (int64_t i = 0; i < n; ++i) {
    // Fibonacci hashing: the top bits of id * 2^64 / phi spread runs of ids.
    uint64_t slot = (static_cast<uint64_t>(id[i]) * 0x9E3779B97F4A7C15ULL) >> (64 - bits);
    while (table[slot] >= 0 && value[table[slot]] != id[i]) slot = (slot + 1) & mask;
    if (table[slot] < 0) {
      table[slot] = distinct;
      value[distinct++] = id[i];
    }
    where[i] = table[slot];
  }
  return {values.narrow(0, 0, distinct).clone(), inverse.view(ids.sizes())};
}

}  // namespace shoal
