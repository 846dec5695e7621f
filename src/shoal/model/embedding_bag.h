// RemoteEmbeddingBag: an embedding-bag layer whose table lives on the ps
// tasks (server/embedding_table.h). Each example has `bags` multi-hot
// features of up to `bag_size` ids each (id -1: an empty slot); the layer
// pulls the rows of a batch's distinct ids, pools each feature's rows (sum
// or mean; an empty feature pools to zeros), and after backward() pushes
// one gradient row per distinct id, summed over the batch by autograd.
//
// A fixed table's ids fold into it (id mod rows), as a hashed categorical
// column does; a dynamic table (rows 0) takes any id >= 0 as it is.
//
// With a RowCache, rows pulled within the last `staleness` steps are taken
// from it and only the others pulled: the most frequent ids of a skewed
// log then cost a pull every staleness + 1 steps, not every step.
//
// Not thread-safe: one per model.
#ifndef SHOAL_MODEL_EMBEDDING_BAG_H_
#define SHOAL_MODEL_EMBEDDING_BAG_H_

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shoal/wire.pb.h"

namespace shoal {

class Client;

enum class Pooling { kSum, kMean };

// Rows a worker pulled, kept for `staleness` steps: a row pulled at step s
// serves steps s .. s + staleness without a pull (it then misses the other
// workers' pushes and this worker's own, up to staleness steps' worth).
// Holds at most `capacity` rows in sets of kWays, an id's set chosen by its
// hash; a row pulled takes the place of the stalest row in its set (one
// pulled longest ago), so the rows that can still serve stay. A lookup or
// an insert reads one set: no hash map, nothing allocated per row (a hash
// map's per-row work cost more than the pulls it spared on one host).
class RowCache {
 public:
  static constexpr int64_t kWays = 4;

  RowCache(int64_t capacity, int64_t dim, int64_t staleness);
  // For distinct `ids` [U] at `step`: the rows of those it holds fresh, into
  // `rows` [U, dim] (float, contiguous); returns which ids hit (bool [U]).
  torch::Tensor Lookup(const torch::Tensor& ids, int64_t step, torch::Tensor& rows);
  // Keeps `rows` [n, dim] of distinct `ids` [n], pulled at `step`.
  void Insert(const torch::Tensor& ids, const torch::Tensor& rows, int64_t step);
  int64_t hits() const { return hits_; }
  int64_t lookups() const { return lookups_; }

 private:
  // The first slot of `id`'s set.
  int64_t SetStart(int64_t id) const;

  struct Slot {
    int64_t id = -1;    // -1: free
    int64_t step = 0;   // the step its row was pulled at
  };
  int64_t ways_, sets_, staleness_, dim_;
  std::vector<float> rows_;   // [sets * ways, dim]
  std::vector<Slot> slots_;   // [sets * ways]: a set of 4 takes 64 bytes
  int64_t hits_ = 0, lookups_ = 0;
};

class RemoteEmbeddingBag {
 public:
  // `table.dim` > 0; `bag_size` > 0; `cache` may be null (no cache).
  RemoteEmbeddingBag(wire::TableDef table, int64_t bag_size, Pooling pooling,
                     std::unique_ptr<RowCache> cache = nullptr);

  const wire::TableDef& table() const { return table_; }

  // ids: int64 [N, bags * bag_size], feature f's ids in columns
  // [f * bag_size, (f + 1) * bag_size). InvalidArgument naming the example,
  // the column and the id for an id below -1. Each Pull is a step for the
  // cache.
  absl::Status Pull(Client& client, const torch::Tensor& ids);
  // The distinct keys (int64 [U]) of `ids`, as the table keys them and as
  // Pull would pull them: empty slots left out, a fixed table's ids folded
  // into it. The same errors as Pull.
  absl::StatusOr<torch::Tensor> DistinctKeys(const torch::Tensor& ids) const;
  // The pooled features of the ids last pulled: [N, bags, dim], with
  // gradients flowing to the pulled rows.
  torch::Tensor Pooled() const;
  // Pushes the gradients on the pulled rows (nothing when backward() did not
  // reach them, unless `progress` asks every shard to hear of the batch:
  // Client::PushRows).
  absl::Status Push(Client& client, const wire::DataProgress* progress = nullptr,
                    wire::ProgressAnswer* answer = nullptr);
  // The distinct ids and the rows of the last pull (tests, the cache).
  const torch::Tensor& distinct_ids() const { return distinct_ids_; }
  const torch::Tensor& rows() const { return rows_; }
  const RowCache* cache() const { return cache_.get(); }

 private:
  // Checks `ids` (as Pull); its present ids as the table keys them, and
  // where they sit (bool [N * bags * bag_size]).
  absl::Status Keys(const torch::Tensor& ids, torch::Tensor* keys, torch::Tensor* present) const;

  wire::TableDef table_;
  int64_t bag_size_;
  Pooling pooling_;
  std::unique_ptr<RowCache> cache_;
  int64_t pulls_ = 0;
  int64_t examples_ = 0, bags_ = 0;
  torch::Tensor distinct_ids_;  // [U] int64, as the table keys them
  torch::Tensor rows_;          // [U, dim], a leaf that requires grad
  torch::Tensor slot_rows_;     // [N * bags * bag_size]: the row of each slot; U for an empty one
  torch::Tensor bag_counts_;    // [N, bags, 1]: ids in each bag (mean pooling)
};

}  // namespace shoal

#endif  // SHOAL_MODEL_EMBEDDING_BAG_H_
