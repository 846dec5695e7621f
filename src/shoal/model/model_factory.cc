#include "shoal/model/model_factory.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shoal/core/status.h"
#include "shoal/model/torchscript_model.h"

namespace shoal {

absl::Status ValidateModelConfig(const ModelConfig& config) {
  if (config.loss != "cross_entropy" && config.loss != "mse" && config.loss != "logistic") {
    return absl::InvalidArgumentError(
        absl::StrCat("model.loss '", config.loss, "' is unknown; known: cross_entropy, mse, logistic"));
  }
  if ((config.kind == "click") != (config.loss == "logistic")) {
    return absl::InvalidArgumentError(absl::StrCat("model.loss logistic is the click model's loss, and its only one; "
                                                   "model.kind ", config.kind, " with model.loss ", config.loss));
  }
  if (config.kind == "click") return ValidateClickConfig(config.click, config.path);
  if (config.kind == "mlp") return ValidateMlpConfig(config);
  if (config.kind == "cnn") return ValidateCnnConfig(config.cnn);
  if (config.kind == "torchscript") {
    if (config.path.empty()) return absl::InvalidArgumentError("model.kind torchscript needs model.path");
    return absl::OkStatus();
  }
  if (config.kind == "module") {
    if (config.module == nullptr) {
      return absl::InvalidArgumentError(
          "model.kind module is a torch::nn::Module handed over through the C++ API (shoal::Job::SetModule); a "
          "config alone cannot name one");
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model.kind '", config.kind, "' is unknown; known: mlp, cnn, torchscript, click"));
}

std::string ModelSummary(const ModelConfig& config) {
  if (config.kind == "torchscript") return absl::StrCat("torchscript ", config.path);
  if (config.kind == "module") return absl::StrCat("module ", config.module ? config.module->name : "(none)");
  if (config.kind == "click") {
    return absl::StrCat("click ", config.click.arch, ", table ", config.click.rows == 0 ? "dynamic" : absl::StrCat(config.click.rows), " x ",
                        config.click.dim);
  }
  if (config.kind == "cnn") {
    std::vector<int64_t> channels;
    for (const ConvLayerConfig& layer : config.cnn.conv) channels.push_back(layer.channels);
    return absl::StrCat("cnn conv ", absl::StrJoin(channels, "-"), " dense ",
                        absl::StrJoin(config.cnn.dense, "-"), config.cnn.batch_norm ? " (BatchNorm)" : "");
  }
  return absl::StrCat("mlp ", absl::StrJoin(config.layers, "-"));
}

namespace {

absl::StatusOr<std::unique_ptr<Model>> MakeModelOfKind(const ModelConfig& config) {
  if (config.kind == "torchscript") {
    auto model = TorchScriptModel::Load(config.path, config.scope);
    if (!model.ok()) return model.status();
    return std::unique_ptr<Model>(std::move(*model));
  }
  if (config.kind == "cnn") return std::unique_ptr<Model>(std::make_unique<Cnn>(config.cnn, config.seed, config.scope));
  if (config.kind == "click") {
    SHOAL_ASSIGN_OR_RETURN(auto model, ClickModel::Create(config.click, config.path, config.seed, config.scope));
    return std::unique_ptr<Model>(std::move(model));
  }
  if (config.kind == "module") {
    SHOAL_ASSIGN_OR_RETURN(auto model, ModuleModel::Create(*config.module, config.seed, config.scope));
    return std::unique_ptr<Model>(std::move(model));
  }
  return std::unique_ptr<Model>(std::make_unique<Mlp>(config));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> MakeModel(const ModelConfig& config) {
  auto model = MakeModelOfKind(config);
  if (model.ok() && config.loss == "mse") (*model)->set_loss(Model::LossKind::kMeanSquaredError);
  if (model.ok() && config.loss == "logistic") (*model)->set_loss(Model::LossKind::kLogistic);
  return model;
}

}  // namespace shoal
