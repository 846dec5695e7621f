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
// Not thread-safe: one per model.
#ifndef SHOAL_MODEL_EMBEDDING_BAG_H_
#define SHOAL_MODEL_EMBEDDING_BAG_H_

#include <torch/types.h>

#include <string>

#include "absl/status/status.h"
#include "shoal/wire.pb.h"

namespace shoal {

class Client;

enum class Pooling { kSum, kMean };

class RemoteEmbeddingBag {
 public:
  // `table.dim` > 0; `bag_size` > 0.
  RemoteEmbeddingBag(wire::TableDef table, int64_t bag_size, Pooling pooling);

  const wire::TableDef& table() const { return table_; }

  // ids: int64 [N, bags * bag_size], feature f's ids in columns
  // [f * bag_size, (f + 1) * bag_size). InvalidArgument naming the example,
  // the column and the id for an id below -1.
  absl::Status Pull(Client& client, const torch::Tensor& ids);
  // The pooled features of the ids last pulled: [N, bags, dim], with
  // gradients flowing to the pulled rows.
  torch::Tensor Pooled() const;
  // Pushes the gradients on the pulled rows (nothing when backward() did not
  // reach them).
  absl::Status Push(Client& client);
  // The distinct ids and the rows of the last pull (tests, the cache).
  const torch::Tensor& distinct_ids() const { return distinct_ids_; }
  const torch::Tensor& rows() const { return rows_; }

 private:
  wire::TableDef table_;
  int64_t bag_size_;
  Pooling pooling_;
  int64_t examples_ = 0, bags_ = 0;
  torch::Tensor distinct_ids_;  // [U] int64, as the table keys them
  torch::Tensor rows_;          // [U, dim], a leaf that requires grad
  torch::Tensor slot_rows_;     // [N * bags * bag_size]: the row of each slot; U for an empty one
  torch::Tensor bag_counts_;    // [N, bags, 1]: ids in each bag (mean pooling)
};

}  // namespace shoal

#endif  // SHOAL_MODEL_EMBEDDING_BAG_H_
