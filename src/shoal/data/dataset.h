// Datasets in the MNIST IDX format (Fashion-MNIST by default) and batching.
//
// ReadIdx() reads one IDX file, gzip-compressed or not, and checks its magic
// number, dimensions and length, so a missing, truncated or corrupt file is an
// error naming the file and what is wrong. LoadMnistFormat() pairs an images
// file with its labels; images become [N, 1, rows, cols] floats scaled to
// [0, 1] and standardised with Fashion-MNIST's mean and deviation.
//
// Dataset is a value type over shared tensors; BatchIterator is not
// thread-safe (one per worker).
#ifndef SHOAL_DATA_DATASET_H_
#define SHOAL_DATA_DATASET_H_

#include <torch/types.h>

#include <string>

#include "absl/status/statusor.h"

namespace shoal {

// Debian's dataset-fashion-mnist installs here.
inline constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

// The raw contents of an IDX file as a uint8 tensor with the file's dimensions.
absl::StatusOr<torch::Tensor> ReadIdx(const std::string& path);

struct Dataset {
  torch::Tensor images;  // [N, ...] float32: each example keeps its shape ([1, 28, 28] for IDX images)
  torch::Tensor labels;  // [N] int64 classes, or [N, ...] float32 regression targets

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
  // The `index`-th of `count` near-equal contiguous shards (worker i reads shard i).
  Dataset Shard(int index, int count) const;
};

// A fingerprint of `data` (positive, never 0): its size and shapes, and the
// bytes of up to 64 examples spread over it. Training sets that differ in
// size or in one of those examples differ in it: a job started again over
// other data (the next day's log) must not read on from the old data's
// place.
int64_t DataFingerprint(const Dataset& data);

// Fashion-MNIST's pixel mean and deviation (of values scaled to [0, 1]).
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

struct RawMnist {
  torch::Tensor images;  // [N, 1, rows, cols] uint8
  torch::Tensor labels;  // [N] int64
};
// Reads `<dir>/<split>-images-idx3-ubyte[.gz]` and the matching labels file;
// `split` is "train" or "t10k".
absl::StatusOr<RawMnist> ReadMnistFormat(const std::string& dir, const std::string& split);
// The same, images scaled to [0, 1] and standardised with Fashion-MNIST's
// mean and deviation.
absl::StatusOr<Dataset> LoadMnistFormat(const std::string& dir, const std::string& split);

// The order in which an epoch visits `size` examples: a permutation drawn
// from the seed and the epoch alone, so any worker draws the same one.
torch::Tensor EpochOrder(int64_t size, uint64_t seed, int64_t epoch);

// Yields shuffled mini-batches, reshuffling at every epoch (each epoch's
// order drawn from the seed and the epoch).
class BatchIterator {
 public:
  BatchIterator(Dataset data, int64_t batch_size, uint64_t seed);
  // Fills the next batch; the last one of an epoch may be smaller.
  void Next(torch::Tensor* images, torch::Tensor* labels);
  int64_t epoch() const { return epoch_; }
  int64_t batch_size() const { return batch_size_; }
  int64_t batches_per_epoch() const { return (data_.size() + batch_size_ - 1) / batch_size_; }
  // Examples drawn so far, over every epoch (an epoch draws each example once).
  int64_t examples_drawn() const { return epoch_ * data_.size() + position_; }
  // Goes to where an iterator over the same data with the same seed stands
  // once it has drawn `examples` examples (below 0: none), in batches of any
  // size: from there on both draw the same examples.
  void SeekTo(int64_t examples);
  // The examples drawn by `batches` batches of this iterator's size from
  // the start (each epoch's last batch may be smaller), for SeekTo.
  int64_t ExamplesInBatches(int64_t batches) const;

 private:
  void Shuffle();

  Dataset data_;
  int64_t batch_size_;
  uint64_t seed_;
  torch::Tensor order_;
  int64_t position_ = 0;
  int64_t epoch_ = 0;
};

// Fraction of `data` that `logits_fn` classifies correctly, in batches.
template <typename LogitsFn>
double Accuracy(const Dataset& data, LogitsFn&& logits_fn, int64_t batch_size = 1000) {
  torch::NoGradGuard no_grad;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < data.size(); begin += batch_size) {
    int64_t n = std::min(batch_size, data.size() - begin);
    torch::Tensor logits = logits_fn(data.images.narrow(0, begin, n));
    correct += logits.argmax(1).eq(data.labels.narrow(0, begin, n)).sum().template item<int64_t>();
  }
  return data.size() == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(data.size());
}

}  // namespace shoal

#endif  // SHOAL_DATA_DATASET_H_
