// RowTables: the embedding tables a model keeps on the ps tasks and reaches
// by id (server/embedding_table.h), never whole. For each batch the rows of
// its ids are pulled before the forward pass, and the gradients backward()
// left on them pushed after; the training modes drive both (step_driver.h)
// and push the rows asynchronously whatever the mode does with the dense
// variables. Tables are not variables: no read, assign or checkpoint of
// variables touches them.
//
// Not thread-safe: one per model.
#ifndef SHOAL_MODEL_ROW_TABLES_H_
#define SHOAL_MODEL_ROW_TABLES_H_

#include <torch/types.h>

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shoal/wire.pb.h"

namespace shoal {

class Client;

class RowTables {
 public:
  virtual ~RowTables() = default;
  // The tables, as the ps tasks create them (CreateTables: creating one that
  // exists with the same definition changes nothing, so every worker may).
  virtual std::vector<wire::TableDef> TableDefs() const = 0;
  // The client pulls and pushes go through; set before the first Pull.
  virtual void Bind(Client* client) = 0;
  // Pulls the rows that `input`'s ids touch; the next Forward(input) uses
  // them (and fails on any other input). InvalidArgument for an id the
  // tables cannot hold; the client's error for a failed call.
  virtual absl::Status Pull(const torch::Tensor& input) = 0;
  // The distinct ids (int64 [U], as the table keys them) of each table, in
  // TableDefs' order, that Pull(input) would pull. Pulls nothing; the same
  // errors as Pull for a bad input.
  virtual absl::StatusOr<std::vector<torch::Tensor>> TableIds(const torch::Tensor& input) const = 0;
  // Pushes the gradients the last backward() left on the rows last pulled,
  // one row per distinct id. Nothing for rows no loss reached. With
  // `progress` (leased data: the batch's places; Client::PushRows) every
  // shard of every table hears of it, and `answer` says where they stand.
  virtual absl::Status Push(const wire::DataProgress* progress = nullptr, wire::ProgressAnswer* answer = nullptr) = 0;

  // The worker-side cache's figures so far: distinct ids looked up, and
  // those served from the cache (both 0 without a cache).
  struct CacheStats {
    int64_t lookups = 0;
    int64_t hits = 0;
  };
  virtual CacheStats cache_stats() const { return {}; }
};

}  // namespace shoal

#endif  // SHOAL_MODEL_ROW_TABLES_H_
