// ClickModel (model.kind click): the built-in click-through model. Its
// tables live on the ps tasks and are reached by id (RowTables); its dense
// part runs on the worker, and its parameters are ordinary variables.
//
// Input: one example per row, int64 [N, integer_features +
// categorical_features * bag_size]: the integer features as they are
// (Criteo's counts; the model takes log(1 + max(x, 0)), DLRM's transform),
// then each categorical feature's ids (-1: an empty slot of a multi-hot
// feature). Output: one logit per example, [N]; the loss is logistic.
//
// The categorical features share one table, "<scope>embeddings" (a feature's
// ids must differ from another's, as the Criteo reader makes them), pooled
// per feature by an embedding bag (sum or mean). The dense part, by
// model.click.arch:
//   wide_deep    wide + deep. The wide part sums one weight per id (the
//                table's last column: rows are dim + 1 wide, so one pull
//                serves both parts) and a linear map of the integer
//                features ("wide/kernel"); the deep part is an MLP over the
//                pooled embeddings and the integer features ("deep/...").
//   dlrm         DLRM: a bottom MLP takes the integer features to dim
//                ("bottom/..."), the pairwise dot products of it and the
//                pooled embeddings, with it, go through the top MLP
//                ("top/...") to the logit.
//   torchscript  the TorchScript module at model.path: forward() takes
//                [N, categorical_features * dim + integer_features] (the
//                pooled embeddings, flattened, then the transformed integer
//                features) and returns the logits, [N] or [N, 1]. Its
//                parameters are "dense/<name>".
//
// Not thread-safe: one model per worker thread.
#ifndef SHOAL_MODEL_CLICK_MODEL_H_
#define SHOAL_MODEL_CLICK_MODEL_H_

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/model/embedding_bag.h"
#include "shoal/model/mlp.h"
#include "shoal/model/model.h"
#include "shoal/model/row_tables.h"
#include "shoal/model/torchscript_model.h"

namespace shoal {

// Adagrad, learning rate 0.05 (TensorFlow's accumulator start, 0.1): the tables' default.
wire::OptimizerConfig DefaultTableOptimizer();

struct ClickConfig {
  std::string arch = "wide_deep";  // wide_deep | dlrm | torchscript
  int64_t integer_features = 13;
  int64_t categorical_features = 26;
  int64_t bag_size = 1;        // ids per categorical feature (multi-hot: > 1, -1 pads)
  std::string pooling = "sum";  // sum | mean
  int64_t rows = 1000000;      // the table's rows; 0: a dynamic table keyed by any id >= 0
  int64_t dim = 16;
  double init_scale = 0.01;    // rows start uniform in [-init_scale, init_scale]
  int64_t min_count = 0;       // dynamic: pushes before an id gets a row
  int64_t steps_to_live = 0;   // dynamic: pushes untouched before a row goes (0: never)
  int64_t max_rows = 0;        // dynamic: rows over all ps tasks (0: as many as fit in their memory)
  bool evict_when_full = false;  // dynamic: when full, the rows untouched longest make room (else new ids wait)
  std::string eviction = "lru";  // with evict_when_full: lru (untouched longest go) or lfu (touched least often)
  int64_t cache_rows = 0;      // the worker-side cache of pulled rows (0: none)
  int64_t cache_staleness = 4;  // steps a cached row serves after its pull
  std::vector<int64_t> hidden = {64, 32};  // wide_deep: the deep MLP; dlrm: the top MLP (then 1)
  std::vector<int64_t> bottom = {32};      // dlrm: the bottom MLP (then dim)
  wire::OptimizerConfig optimizer = DefaultTableOptimizer();  // the table's
};

// The keys make sense (arch, pooling, positive sizes, the bottom MLP);
// `path` is model.path (torchscript).
absl::Status ValidateClickConfig(const ClickConfig& config, const std::string& path);

// log(1 + max(x, 0)) of int64 counts, as float32: the integer features the dense part sees.
torch::Tensor ClickDenseFeatures(const torch::Tensor& integers);

class ClickModel final : public Model, public RowTables {
 public:
  // `config` must have passed ValidateClickConfig.
  static absl::StatusOr<std::unique_ptr<ClickModel>> Create(const ClickConfig& config, const std::string& path,
                                                            uint64_t seed, const std::string& scope);

  const std::vector<std::string>& variable_names() const override { return names_; }
  const std::vector<torch::Tensor>& variables() const override { return params_; }
  const std::vector<std::string>& buffer_names() const override;
  const std::vector<torch::Tensor>& buffers() const override;
  // Logits [N] of a batch whose rows Pull fetched; throws std::logic_error
  // for any other batch.
  torch::Tensor Forward(const torch::Tensor& input) override;
  void SetTraining(bool training) override;
  RowTables* row_tables() override { return this; }
  // The dense part, which serving runs after looking up the tables itself:
  // forward(integers, pooled) takes the integer features as they come (int64
  // [N, integer_features], transformed inside as in training) and each
  // categorical feature's pooled rows (float32 [N, categorical_features,
  // width], width the table's: dim, plus the wide weight's column for
  // wide_deep), and gives the logits [N].
  absl::StatusOr<torch::jit::Module> Script() const override;

  // RowTables.
  std::vector<wire::TableDef> TableDefs() const override { return {bag_.table()}; }
  void Bind(Client* client) override { client_ = client; }
  absl::Status Pull(const torch::Tensor& input) override;
  absl::StatusOr<std::vector<torch::Tensor>> TableIds(const torch::Tensor& input) const override;
  absl::Status Push(const wire::DataProgress* progress = nullptr, wire::ProgressAnswer* answer = nullptr) override;
  CacheStats cache_stats() const override;

  // The table's rows of the last pull (tests).
  const RemoteEmbeddingBag& bag() const { return bag_; }

 private:
  // `input`'s categorical columns (the bag's ids), after checking its shape.
  absl::StatusOr<torch::Tensor> CategoricalColumns(const torch::Tensor& input) const;
  ClickModel(const ClickConfig& config, wire::TableDef table);

  ClickConfig config_;
  RemoteEmbeddingBag bag_;
  Client* client_ = nullptr;
  torch::Tensor pulled_input_;  // the batch Pull fetched rows for
  std::unique_ptr<Mlp> deep_, bottom_, top_;
  torch::Tensor wide_kernel_;   // wide_deep: [integer_features, 1]
  std::unique_ptr<TorchScriptModel> dense_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;
};

}  // namespace shoal

#endif  // SHOAL_MODEL_CLICK_MODEL_H_
