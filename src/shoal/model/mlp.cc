#include "shoal/model/mlp.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "shoal/model/script_builder.h"

namespace shoal {

absl::Status ValidateMlpConfig(const MlpConfig& config) {
  if (config.layers.size() < 2) {
    return absl::InvalidArgumentError("model.layers needs at least an input and an output size");
  }
  for (size_t i = 0; i < config.layers.size(); ++i) {
    if (config.layers[i] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("model.layers[", i, "] = ", config.layers[i], " must be positive"));
    }
  }
  if (config.activation != "relu" && config.activation != "tanh" && config.activation != "sigmoid") {
    return absl::InvalidArgumentError(absl::StrCat("model.activation '", config.activation,
                                                   "' is unknown; known: relu, tanh, sigmoid"));
  }
  return absl::OkStatus();
}

Mlp::Mlp(const MlpConfig& config) : config_(config) {
  torch::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(config.seed);
  for (size_t k = 0; k + 1 < config.layers.size(); ++k) {
    const int64_t in = config.layers[k], out = config.layers[k + 1];
    const double limit = std::sqrt(6.0 / static_cast<double>(in + out));  // Glorot uniform
    torch::Tensor kernel = torch::empty({in, out}).uniform_(-limit, limit, generator);
    torch::Tensor bias = torch::zeros({out});
    const std::string layer = absl::StrCat("dense_", k + 1);
    params_.push_back(register_parameter(layer + "_kernel", kernel));
    params_.push_back(register_parameter(layer + "_bias", bias));
    names_.push_back(absl::StrCat(config.scope, layer, "/kernel"));
    names_.push_back(absl::StrCat(config.scope, layer, "/bias"));
  }
}

torch::Tensor Mlp::Forward(const torch::Tensor& input) {
  torch::Tensor h = input.dim() == 2 ? input : input.flatten(1);  // images [N, 1, 28, 28] -> [N, 784]
  const size_t layers = params_.size() / 2;
  for (size_t k = 0; k < layers; ++k) {
    h = torch::addmm(params_[2 * k + 1], h, params_[2 * k]);
    if (k + 1 == layers && !config_.activate_output) break;
    if (config_.activation == "relu") {
      h = torch::relu(h);
    } else if (config_.activation == "tanh") {
      h = torch::tanh(h);
    } else {
      h = torch::sigmoid(h);
    }
  }
  return h;
}

absl::StatusOr<torch::jit::Module> Mlp::Script() const {
  ScriptBuilder builder("Mlp");
  std::vector<std::string> attributes;
  for (size_t i = 0; i < params_.size(); ++i) {
    attributes.push_back(builder.AddParameter(names_[i].substr(config_.scope.size()), params_[i]));
  }
  std::string source = "def forward(self, x: Tensor) -> Tensor:\n    h = x.flatten(1)\n";
  const size_t layers = attributes.size() / 2;
  for (size_t k = 0; k < layers; ++k) {
    absl::StrAppend(&source, "    h = torch.addmm(self.", attributes[2 * k + 1], ", h, self.", attributes[2 * k], ")\n");
    if (k + 1 == layers && !config_.activate_output) break;
    absl::StrAppend(&source, "    h = torch.", config_.activation, "(h)\n");
  }
  absl::StrAppend(&source, "    return h\n");
  return builder.Finish(source);
}

}  // namespace shoal
