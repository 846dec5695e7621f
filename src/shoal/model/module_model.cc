#include "shoal/model/module_model.h"

#include <mutex>

#include "absl/strings/str_cat.h"
#include "shoal/core/dtype.h"

namespace shoal {
namespace {

// torch's default generator is global: seeding it and drawing the module's
// initial values must not interleave with another thread doing the same.
std::mutex& SeedMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModuleModel>> ModuleModel::Create(const ModuleFactory& factory, int64_t seed,
                                                                 const std::string& scope) {
  const std::string what = absl::StrCat("module '", factory.name, "'");
  if (!factory.make || !factory.forward) return absl::InvalidArgumentError(absl::StrCat(what, " has no factory"));
  std::unique_ptr<ModuleModel> model(new ModuleModel());
  try {
    std::lock_guard<std::mutex> lock(SeedMutex());
    torch::manual_seed(seed);
    model->module_ = factory.make();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": its factory threw: ", e.what()));
  }
  if (model->module_ == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": its factory returned null"));
  model->forward_ = factory.forward;
  model->name_ = factory.name;
  for (const auto& parameter : model->module_->named_parameters(/*recurse=*/true)) {
    if (parameter.value().scalar_type() != torch::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": parameter '", parameter.key(), "' is ",
                                                     DTypeName(parameter.value().scalar_type()),
                                                     "; shoal trains float32 parameters"));
    }
    model->names_.push_back(scope + parameter.key());
    model->params_.push_back(parameter.value());
  }
  if (model->params_.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " has no parameters to train"));
  for (const auto& buffer : model->module_->named_buffers(/*recurse=*/true)) {
    if (!WireDType(buffer.value().scalar_type())) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": buffer '", buffer.key(), "' is ",
                                                     DTypeName(buffer.value().scalar_type()),
                                                     "; shoal carries float32 and int64 buffers"));
    }
    model->buffer_names_.push_back(scope + buffer.key());
    model->buffers_.push_back(buffer.value());
  }
  model->module_->train(true);
  return model;
}

absl::StatusOr<torch::jit::Module> ModuleModel::Script() const {
  return absl::UnimplementedError(absl::StrCat(
      "module '", name_, "' is a C++ torch::nn::Module, which libtorch cannot turn into TorchScript; its trained "
      "values are in weights.pt by parameter name (torch::pickle_load, or torch.load in Python)"));
}

}  // namespace shoal
