#include "shoal/core/distinct_ids.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <random>
#include <set>
#include <vector>

namespace shoal {
namespace {

// `found` holds each id of `ids` once, in the order of first appearance,
// and its inverse maps every id back to itself.
void ExpectDistinctInOrder(const torch::Tensor& ids, const DistinctIds& found) {
  std::vector<int64_t> expected;
  std::set<int64_t> seen;
  const torch::Tensor flat = ids.contiguous().view({-1});
  for (int64_t i = 0; i < flat.numel(); ++i) {
    if (seen.insert(flat[i].item<int64_t>()).second) expected.push_back(flat[i].item<int64_t>());
  }
  EXPECT_TRUE(found.values.equal(torch::tensor(expected, torch::kInt64).view({-1})));
  EXPECT_EQ(found.inverse.sizes(), ids.sizes());
  EXPECT_TRUE(found.values.index_select(0, found.inverse.view({-1})).view(ids.sizes()).equal(ids));
}

TEST(DistinctIdsTest, EachIdOnceInTheOrderItFirstAppearsAndEveryIdMapsBack) {
  const int64_t extreme = std::numeric_limits<int64_t>::max(), lowest = std::numeric_limits<int64_t>::min();
  ExpectDistinctInOrder(torch::tensor(std::vector<int64_t>{5, 3, 5, -1, 3, extreme, lowest, 0, extreme}),
                        FindDistinctIds(torch::tensor(std::vector<int64_t>{5, 3, 5, -1, 3, extreme, lowest, 0, extreme})));
  const torch::Tensor none = torch::empty({0}, torch::kInt64);
  ExpectDistinctInOrder(none, FindDistinctIds(none));
  const torch::Tensor same = torch::full({100}, 7, torch::kInt64);
  ExpectDistinctInOrder(same, FindDistinctIds(same));
  const torch::Tensor grid = torch::arange(12, torch::kInt64).remainder(5).view({3, 4});  // any shape
  ExpectDistinctInOrder(grid, FindDistinctIds(grid));
}

TEST(DistinctIdsTest, AgreesWithTorchOnSkewedBatches) {
  std::mt19937_64 random(3);
  for (int64_t n : {1, 17, 1000, 26624}) {
    SCOPED_TRACE(n);
    // Half the draws are 50 hot ids far apart (high bits set), half spread
    // over [0, n]: many duplicates, and ids of both kinds probing past each
    // other in a table at most half full.
    std::vector<int64_t> drawn(static_cast<size_t>(n));
    for (int64_t& id : drawn) {
      const uint64_t r = random();
      id = (r & 1) ? static_cast<int64_t>((r >> 1) % 50) << 40 : static_cast<int64_t>(r >> 1) % (n + 1);
    }
    const torch::Tensor ids = torch::tensor(drawn, torch::kInt64);
    const DistinctIds found = FindDistinctIds(ids);
    ExpectDistinctInOrder(ids, found);
    EXPECT_EQ(found.values.numel(), std::get<0>(torch::_unique(ids)).numel());
  }
}

}  // namespace
}  // namespace shoal
