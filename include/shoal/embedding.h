// shoal::Embedding and shoal::EmbeddingBag: a table on the ps tasks as a
// libtorch layer, as torch::nn::Embedding is a local one (the C++ form of
// Python's shoal.Embedding). Part of shoal's public C++ API.
//
//   shoal::ClusterClient client(cluster_json, {});
//   shoal::TableOptions options;  // a dynamic table of 16 columns
//   client.CreateTable("emb", options);
//   shoal::EmbeddingBag bag(&client, "emb", shoal::BagMode::kMean);
//   torch::Tensor loss = loss_fn(dense(bag(ids)), labels);
//   loss.backward();  // also pushes the rows' gradients to the table
//
// forward pulls each distinct id of the batch once. While autograd records,
// backward pushes the gradient of each distinct id's row (summed over its
// uses) to the table's sparse optimizer on the ps, so the table trains
// without an optimizer step here; every backward through a forward pushes
// once. Under torch::NoGradGuard (evaluation) nothing is pushed. An id equal
// to `padding_idx` is neither pulled nor pushed: its row is zeros, and a
// bag's mean leaves it out. Errors are shoal::Error, naming the table; a
// push the ps refuses (a NaN gradient, a ps gone) ends backward with its.
#ifndef SHOAL_EMBEDDING_H_
#define SHOAL_EMBEDDING_H_

#include <torch/torch.h>

#include <optional>
#include <string>

#include "shoal/shoal.h"

namespace shoal {

// The distinct values of `ids` (an int64 tensor of any shape) in the order
// they first appear, [n], and where each id's value is among them, shaped
// as `ids`: torch.unique(ids, sorted=False, return_inverse=True) in one
// pass over a hash table. What the layers pull and push by.
std::tuple<torch::Tensor, torch::Tensor> UniqueIds(const torch::Tensor& ids);

class EmbeddingImpl : public torch::nn::Module {
 public:
  // `client` must outlive the layer and every graph its forward records.
  EmbeddingImpl(ClusterClient* client, std::string table, std::optional<int64_t> padding_idx = std::nullopt);
  // ids: an integer tensor of any shape; returns float32 [*ids.shape, dim].
  torch::Tensor forward(const torch::Tensor& ids);
  const std::string& table() const { return table_; }
  void pretty_print(std::ostream& stream) const override;

 protected:
  // The rows of the ids' distinct values [n, dim] (with padding_idx, a row
  // of zeros after them), and where each id's row is among them.
  struct Pulled {
    torch::Tensor rows, where;
  };
  Pulled Pull(const torch::Tensor& ids, const char* layer);
  // "shoal::EmbeddingBag 'emb'": the start of this layer's errors.
  std::string Where(const char* layer) const;

  ClusterClient* client_;
  std::string table_;
  std::optional<int64_t> padding_idx_;
};
TORCH_MODULE(Embedding);

enum class BagMode { kSum, kMean };

// A table pooled per bag, as torch::nn::EmbeddingBag.
class EmbeddingBagImpl : public EmbeddingImpl {
 public:
  EmbeddingBagImpl(ClusterClient* client, std::string table, BagMode mode = BagMode::kSum,
                   std::optional<int64_t> padding_idx = std::nullopt);
  // ids [batch, bag] (one bag a row) -> [batch, dim]; or ids [n] with
  // `offsets` [batches] (bag b from offsets[b] to the next) -> [batches, dim].
  // `per_sample_weights` (kSum, shaped as ids) scales each id's row.
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& offsets = {},
                        const torch::Tensor& per_sample_weights = {});
  void pretty_print(std::ostream& stream) const override;

 private:
  BagMode mode_;
};
TORCH_MODULE(EmbeddingBag);

}  // namespace shoal

#endif  // SHOAL_EMBEDDING_H_
