#include "shoal/data/data_source.h"

#include "absl/strings/str_cat.h"
#include "shoal/core/dtype.h"
#include "shoal/core/status.h"
#include "shoal/data/criteo.h"
#include "shoal/data/npy.h"

namespace shoal {
namespace {

class IdxSource : public DataSource {
 public:
  explicit IdxSource(DataConfig config) : config_(std::move(config)) {}
  absl::StatusOr<Dataset> Load(bool train) const override {
    SHOAL_ASSIGN_OR_RETURN(RawMnist raw, ReadMnistFormat(config_.dir, train ? "train" : "t10k"));
    return MakeDataset(raw.images, raw.labels, config_.normalize, kFashionMnistMean, kFashionMnistStd,
                       absl::StrCat("the IDX files in '", config_.dir, "'"));
  }

 private:
  DataConfig config_;
};

class NpySource : public DataSource {
 public:
  explicit NpySource(DataConfig config) : config_(std::move(config)) {}
  absl::StatusOr<Dataset> Load(bool train) const override {
    const std::string& features_path = train ? config_.train_features : config_.test_features;
    const std::string& labels_path = train ? config_.train_labels : config_.test_labels;
    SHOAL_ASSIGN_OR_RETURN(torch::Tensor features, ReadNpy(features_path));
    SHOAL_ASSIGN_OR_RETURN(torch::Tensor labels, ReadNpy(labels_path));
    return MakeDataset(features, labels, config_.normalize, 0.0, 1.0,
                       absl::StrCat("'", features_path, "' and '", labels_path, "'"));
  }

 private:
  DataConfig config_;
};

class TensorSource : public DataSource {
 public:
  explicit TensorSource(DataConfig config) : config_(std::move(config)) {}
  absl::StatusOr<Dataset> Load(bool train) const override {
    const TensorData& data = *config_.tensors;
    return MakeDataset(train ? data.train_features : data.test_features,
                       train ? data.train_labels : data.test_labels, config_.normalize, 0.0, 1.0,
                       train ? "the training tensors" : "the test tensors");
  }

 private:
  DataConfig config_;
};

class CriteoSource : public DataSource {
 public:
  explicit CriteoSource(DataConfig config) : config_(std::move(config)) {}
  absl::StatusOr<Dataset> Load(bool train) const override {
    CriteoOptions options;
    options.max_examples = train ? config_.train_examples : config_.test_examples;
    SHOAL_ASSIGN_OR_RETURN(ClickLog log, ReadCriteo(train ? config_.train_file : config_.test_file, options));
    return Dataset{log.examples, log.labels};
  }

 private:
  DataConfig config_;
};

}  // namespace

absl::Status ValidateDataConfig(const DataConfig& config) {
  if (config.format == "npy") {
    for (const auto& [key, path] : {std::pair{"train_features", &config.train_features},
                                    std::pair{"train_labels", &config.train_labels},
                                    std::pair{"test_features", &config.test_features},
                                    std::pair{"test_labels", &config.test_labels}}) {
      if (path->empty()) return absl::InvalidArgumentError(absl::StrCat("data.format npy needs data.", key));
    }
  } else if (config.format == "tensors") {
    if (config.tensors == nullptr) {
      return absl::InvalidArgumentError(
          "data.format tensors takes tensors handed over through the API (shoal::Job::SetData, shoal.train's "
          "data); a config alone cannot give them");
    }
    for (const torch::Tensor* t : {&config.tensors->train_features, &config.tensors->train_labels,
                                   &config.tensors->test_features, &config.tensors->test_labels}) {
      if (!t->defined()) return absl::InvalidArgumentError("data.format tensors: a training or test tensor is missing");
    }
  } else if (config.format == "criteo") {
    if (config.train_file.empty() || config.test_file.empty()) {
      return absl::InvalidArgumentError("data.format criteo needs data.train_file and data.test_file");
    }
  } else if (config.format != "idx") {
    return absl::InvalidArgumentError(
        absl::StrCat("data.format '", config.format, "' is unknown; known: idx, npy, criteo"));
  }
  if (config.normalize.std && !(*config.normalize.std > 0)) {
    return absl::InvalidArgumentError("data.normalize.std must be positive");
  }
  if (config.normalize.scale < 0) return absl::InvalidArgumentError("data.normalize.scale must not be negative");
  return absl::OkStatus();
}

std::unique_ptr<DataSource> MakeDataSource(const DataConfig& config) {
  if (config.format == "npy") return std::make_unique<NpySource>(config);
  if (config.format == "tensors") return std::make_unique<TensorSource>(config);
  if (config.format == "criteo") return std::make_unique<CriteoSource>(config);
  return std::make_unique<IdxSource>(config);
}

absl::StatusOr<Dataset> MakeDataset(const torch::Tensor& features, const torch::Tensor& labels,
                                    const Normalization& normalize, double default_mean, double default_std,
                                    const std::string& where) {
  if (features.scalar_type() != torch::kFloat32 && features.scalar_type() != torch::kUInt8) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the features are ", DTypeName(features.scalar_type()),
                                                   "; shoal reads float32 or uint8 features"));
  }
  if (features.dim() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the features have ", features.dim(),
                                                   " dimensions; expected [N, ...] (one example per row)"));
  }
  const bool classes = labels.scalar_type() == torch::kInt64 && labels.dim() == 1;
  const bool targets = labels.scalar_type() == torch::kFloat32 && labels.dim() >= 1;
  if (!classes && !targets) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": the labels must be int64 classes of shape [N] or float32 targets of shape [N, ...], are ",
        DTypeName(labels.scalar_type()), " with ", labels.dim(), " dimensions"));
  }
  if (labels.size(0) != features.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", features.size(0), " examples but ", labels.size(0),
                                                   " labels"));
  }
  if (classes && labels.numel() > 0 && labels.min().item<int64_t>() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a class label is negative"));
  }
  if (targets && !torch::isfinite(labels).all().item<bool>()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a target is NaN or infinite"));
  }
  torch::Tensor images = features.to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
  if (normalize.scale > 0) {
    images.mul_(normalize.scale);
  } else if (features.scalar_type() == torch::kUInt8) {
    images.div_(255.0f);  // bytes to [0, 1]
  }
  images.sub_(static_cast<float>(normalize.mean.value_or(default_mean)))
      .div_(static_cast<float>(normalize.std.value_or(default_std)));
  if (!torch::isfinite(images).all().item<bool>()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a feature is NaN or infinite"));
  }
  return Dataset{images, labels};
}

}  // namespace shoal
