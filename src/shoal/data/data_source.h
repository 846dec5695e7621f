// DataSource: where a job's training and test examples come from, chosen by
// `data.format`:
//   idx  MNIST-format files in data.dir (Fashion-MNIST by default), images
//        [N, 1, rows, cols];
//   npy  numpy.save files: features of any shape, float32 or uint8, and
//        int64 class labels (or float32 targets, for model.loss mse), one
//        file each for the training and the test split;
//   tensors  the same, as tensors a program handed over through its API
//        (never from a file; in-process only);
//   criteo  click logs in the Criteo format (data/criteo.h), data.train_file
//        and data.test_file: each example int64 [13 + 26] (the integers as
//        they are, then the categorical ids), labels float32 0/1; what the
//        click model reads. Not normalised.
// Features are normalised as data.normalize says: scaled (uint8 by 1/255
// unless told otherwise), then standardised with a mean and a deviation.
// Every file is checked before it is used: a missing, truncated or garbled
// file, a dtype shoal does not read, or features and labels whose counts
// differ is an error naming the file.
#ifndef SHOAL_DATA_DATA_SOURCE_H_
#define SHOAL_DATA_DATA_SOURCE_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "shoal/data/dataset.h"

namespace shoal {

struct Normalization {
  double scale = 0;           // features *= scale first; 0: 1/255 for uint8 features, 1 for float32
  std::optional<double> mean;  // then -= mean; unset: Fashion-MNIST's for idx, 0 for npy
  std::optional<double> std;   // then /= std; unset: Fashion-MNIST's for idx, 1 for npy
};

// Examples a program holds in memory (data.format tensors): features and
// labels as the npy format takes them.
struct TensorData {
  torch::Tensor train_features, train_labels, test_features, test_labels;
};

struct DataConfig {
  std::string format = "idx";  // idx | npy | tensors | criteo
  std::string dir;             // idx: default Fashion-MNIST from dataset-fashion-mnist
  // npy: one file each (features [N, ...], labels [N])
  std::string train_features, train_labels, test_features, test_labels;
  // criteo: one click log each
  std::string train_file, test_file;
  // tensors: set by the C++ API, never parsed or written out.
  std::shared_ptr<const TensorData> tensors;
  Normalization normalize;
  int64_t train_examples = 0;  // 0: all; else the first N (quick runs, tests)
  int64_t test_examples = 0;
  // Leased data (strategy/leased_data.h): workers take shards of each epoch
  // from the counter task as they go, so that workers may come and go and
  // every example is trained once. Off: each worker reads its own slice.
  bool leases = false;
  int64_t lease_shard_examples = 0;  // 0: about 1/16 of an epoch, a whole number of batches (at most 32)
  double lease_timeout_s = 10;       // a lease its holder did not renew for this long goes to another worker
};

// The format is known and has its files named; the deviation is positive.
absl::Status ValidateDataConfig(const DataConfig& config);

class DataSource {
 public:
  virtual ~DataSource() = default;
  // The training split (`train`) or the test split, normalised.
  virtual absl::StatusOr<Dataset> Load(bool train) const = 0;
};

// `config` must have passed ValidateDataConfig.
std::unique_ptr<DataSource> MakeDataSource(const DataConfig& config);

// Features (float32 or uint8, [N, ...]) and labels (int64 classes [N] or
// float32 targets [N, ...]) as a Dataset,
// normalised; `where` names them in errors ("'x.npy' and 'y.npy'").
absl::StatusOr<Dataset> MakeDataset(const torch::Tensor& features, const torch::Tensor& labels,
                                    const Normalization& normalize, double default_mean, double default_std,
                                    const std::string& where);

}  // namespace shoal

#endif  // SHOAL_DATA_DATA_SOURCE_H_
