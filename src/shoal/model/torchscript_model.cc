#include "shoal/model/torchscript_model.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shoal/core/dtype.h"

namespace shoal {
namespace {

// The first line of a libtorch error: the rest is a C++ stack.
std::string FirstLine(const std::string& what) { return what.substr(0, what.find('\n')); }

}  // namespace

absl::StatusOr<std::unique_ptr<TorchScriptModel>> TorchScriptModel::Load(const std::string& path,
                                                                         const std::string& scope) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    return absl::NotFoundError(absl::StrCat("model.path '", path, "': no such file"));
  }
  torch::jit::Module module;
  try {
    module = torch::jit::load(path);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.path '", path, "' is not a TorchScript file: ", FirstLine(e.what())));
  }
  std::unique_ptr<TorchScriptModel> model(new TorchScriptModel(module));
  for (const auto& parameter : module.named_parameters(/*recurse=*/true)) {
    if (parameter.value.scalar_type() != torch::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat("model.path '", path, "': parameter '", parameter.name, "' is ",
                                                     DTypeName(parameter.value.scalar_type()),
                                                     "; shoal trains float32 parameters"));
    }
    model->names_.push_back(scope + parameter.name);
    // A parameter is trained, whatever flag the file saved it with.
    model->params_.push_back(parameter.value.requires_grad_(true));
  }
  if (model->params_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("model.path '", path, "' has no parameters to train"));
  }
  for (const auto& buffer : module.named_buffers(/*recurse=*/true)) {
    if (!WireDType(buffer.value.scalar_type())) {
      return absl::InvalidArgumentError(absl::StrCat("model.path '", path, "': buffer '", buffer.name, "' is ",
                                                     DTypeName(buffer.value.scalar_type()),
                                                     "; shoal carries float32 and int64 buffers"));
    }
    model->buffer_names_.push_back(scope + buffer.name);
    model->buffers_.push_back(buffer.value);
  }
  model->module_.train(true);
  return model;
}

torch::Tensor TorchScriptModel::Forward(const torch::Tensor& input) { return module_.forward({input}).toTensor(); }

absl::StatusOr<torch::jit::Module> TorchScriptModel::Script() const {
  torch::jit::Module copy = module_.deepcopy();
  copy.eval();
  return copy;
}

}  // namespace shoal
