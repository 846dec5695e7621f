#include "shoal/data/dataset.h"

#include <ATen/CPUGeneratorImpl.h>
#include <zlib.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shoal/core/crc32c.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

constexpr int64_t kMaxIdxBytes = int64_t{1} << 32;

// Reads exactly n bytes or reports how the file ended.
absl::Status ReadExactly(gzFile file, void* dst, int64_t n, const std::string& path, absl::string_view what) {
  char* out = static_cast<char*>(dst);
  while (n > 0) {
    unsigned chunk = static_cast<unsigned>(std::min<int64_t>(n, 1 << 30));
    int got = gzread(file, out, chunk);
    if (got < 0) {
      int err = 0;
      return absl::DataLossError(absl::StrCat("IDX file '", path, "' is corrupt while reading ", what, ": ",
                                              gzerror(file, &err)));
    }
    if (got == 0) {
      return absl::DataLossError(absl::StrCat("IDX file '", path, "' is truncated: it ends inside the ", what));
    }
    out += got;
    n -= got;
  }
  return absl::OkStatus();
}

std::string FindFile(const std::string& dir, const std::string& base) {
  for (const char* suffix : {".gz", ""}) {
    std::string path = absl::StrCat(dir, "/", base, suffix);
    if (std::filesystem::exists(path)) return path;
  }
  return absl::StrCat(dir, "/", base, ".gz");
}

}  // namespace

absl::StatusOr<torch::Tensor> ReadIdx(const std::string& path) {
  if (!std::filesystem::exists(path)) {
    return absl::NotFoundError(absl::StrCat("data file '", path,
                                            "' does not exist (Fashion-MNIST comes with the Debian package "
                                            "dataset-fashion-mnist)"));
  }
  gzFile file = gzopen(path.c_str(), "rb");  // reads plain files too
  if (file == nullptr) return absl::NotFoundError(absl::StrCat("cannot open data file '", path, "'"));
  std::unique_ptr<gzFile_s, int (*)(gzFile)> closer(file, gzclose);
  unsigned char magic[4];
  SHOAL_RETURN_IF_ERROR(ReadExactly(file, magic, 4, path, "magic number"));
  // Magic: two zero bytes, a type code (0x08 = unsigned byte), the number of dimensions.
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] == 0 || magic[3] > 4) {
    return absl::DataLossError(absl::StrCat("'", path, "' is not an unsigned-byte IDX file (magic ",
                                            int{magic[0]}, ",", int{magic[1]}, ",", int{magic[2]}, ",",
                                            int{magic[3]}, ")"));
  }
  std::vector<int64_t> dims(magic[3]);
  int64_t total = 1;
  for (auto& d : dims) {
    unsigned char b[4];
    SHOAL_RETURN_IF_ERROR(ReadExactly(file, b, 4, path, "dimensions"));
    d = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | int64_t{b[3]};
    total *= std::max<int64_t>(d, 1);
    if (total > kMaxIdxBytes) return absl::DataLossError(absl::StrCat("IDX file '", path, "' announces too much data"));
  }
  torch::Tensor data = torch::empty(dims, torch::kUInt8);
  SHOAL_RETURN_IF_ERROR(ReadExactly(file, data.data_ptr(), data.numel(), path, "data"));
  char extra;
  if (gzread(file, &extra, 1) != 0) {
    return absl::DataLossError(absl::StrCat("IDX file '", path, "' has bytes after its [",
                                            absl::StrJoin(dims, ","), "] data"));
  }
  return data;
}

Dataset Dataset::Shard(int index, int count) const {
  const int64_t n = size();
  const int64_t begin = n * index / count, end = n * (index + 1) / count;
  return Dataset{images.narrow(0, begin, end - begin), labels.narrow(0, begin, end - begin)};
}

absl::StatusOr<RawMnist> ReadMnistFormat(const std::string& dir, const std::string& split) {
  const std::string images_path = FindFile(dir, split + "-images-idx3-ubyte");
  const std::string labels_path = FindFile(dir, split + "-labels-idx1-ubyte");
  SHOAL_ASSIGN_OR_RETURN(torch::Tensor images, ReadIdx(images_path));
  SHOAL_ASSIGN_OR_RETURN(torch::Tensor labels, ReadIdx(labels_path));
  if (images.dim() != 3) {
    return absl::DataLossError(absl::StrCat("'", images_path, "' should hold [N, rows, cols] images, has ",
                                            images.dim(), " dimensions"));
  }
  if (labels.dim() != 1 || labels.size(0) != images.size(0)) {
    return absl::DataLossError(absl::StrCat("'", labels_path, "' has ", labels.dim() == 1 ? labels.size(0) : -1,
                                            " labels for ", images.size(0), " images in '", images_path, "'"));
  }
  if (labels.max().item<int>() > 9) {
    return absl::DataLossError(absl::StrCat("'", labels_path, "' has a label above 9"));
  }
  // [N, 1, rows, cols]: one channel, so that a CNN reads the images as they
  // are; the MLP flattens them.
  return RawMnist{images.unsqueeze(1), labels.to(torch::kInt64)};
}

absl::StatusOr<Dataset> LoadMnistFormat(const std::string& dir, const std::string& split) {
  SHOAL_ASSIGN_OR_RETURN(RawMnist raw, ReadMnistFormat(dir, split));
  Dataset data;
  data.images = raw.images.to(torch::kFloat32).div_(255.0f).sub_(kFashionMnistMean).div_(kFashionMnistStd);
  data.labels = raw.labels;
  return data;
}

int64_t DataFingerprint(const Dataset& data) {
  // Two CRCs from different starts make 64 bits.
  uint32_t low = 0, high = 0x9E3779B9u;
  auto add = [&](const void* bytes, size_t size) {
    low = Crc32c(bytes, size, low);
    high = Crc32c(bytes, size, high);
  };
  const int64_t size = data.size();
  add(&size, sizeof(size));
  if (size > 0) {
    for (const torch::Tensor& part : {data.images, data.labels}) {
      const std::vector<int64_t> shape = part.sizes().vec();
      add(shape.data(), shape.size() * sizeof(int64_t));
    }
    const int64_t samples = std::min<int64_t>(64, size);
    for (int64_t k = 0; k < samples; ++k) {
      const int64_t at = k * size / samples;
      for (const torch::Tensor& part : {data.images, data.labels}) {
        const torch::Tensor example = part[at].contiguous();
        add(example.data_ptr(), example.nbytes());
      }
    }
  }
  const uint64_t both = (static_cast<uint64_t>(high) << 32) | low;
  return static_cast<int64_t>(both & 0x7FFFFFFFFFFFFFFFull) | 1;
}

BatchIterator::BatchIterator(Dataset data, int64_t batch_size, uint64_t seed)
    : data_(std::move(data)), batch_size_(std::max<int64_t>(1, batch_size)), seed_(seed) {
  Shuffle();
}

void BatchIterator::SeekTo(int64_t examples) {
  const int64_t size = data_.size();
  examples = std::max<int64_t>(0, examples);
  // An epoch's last example drawn leaves the iterator at the end of that
  // epoch (its next draw shuffles), as drawing would.
  epoch_ = size > 0 && examples > 0 ? (examples - 1) / size : 0;
  position_ = size > 0 ? examples - epoch_ * size : 0;
  Shuffle();
}

int64_t BatchIterator::ExamplesInBatches(int64_t batches) const {
  const int64_t per_epoch = batches_per_epoch();
  if (per_epoch == 0 || batches <= 0) return 0;
  int64_t examples = 0;
  if (__builtin_mul_overflow(batches / per_epoch, data_.size(), &examples) ||
      __builtin_add_overflow(examples, batches % per_epoch * batch_size_, &examples)) {
    return INT64_MAX;  // a count of batches no job reaches: a far place, not a negative one
  }
  return examples;
}

torch::Tensor EpochOrder(int64_t size, uint64_t seed, int64_t epoch) {
  // Each epoch's order from its own seed, so that seeking to any epoch
  // costs one shuffle, whatever the position (epoch 0's seed is `seed`).
  const uint64_t epoch_seed = seed + static_cast<uint64_t>(epoch) * 0x9E3779B97F4A7C15ull;
  torch::Generator generator = at::make_generator<at::CPUGeneratorImpl>(epoch_seed);
  return torch::randperm(size, generator, torch::kInt64);
}

void BatchIterator::Shuffle() { order_ = EpochOrder(data_.size(), seed_, epoch_); }

void BatchIterator::Next(torch::Tensor* images, torch::Tensor* labels) {
  if (position_ >= data_.size()) {
    position_ = 0;
    ++epoch_;
    Shuffle();
  }
  const int64_t n = std::min(batch_size_, data_.size() - position_);
  torch::Tensor index = order_.narrow(0, position_, n);
  position_ += n;
  *images = data_.images.index_select(0, index);
  *labels = data_.labels.index_select(0, index);
}

}  // namespace shoal
