#include "shoal/model/cnn.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "shoal/model/script_builder.h"

namespace shoal {
namespace {

constexpr double kBatchNormEpsilon = 1e-5;  // torch.nn.BatchNorm2d's

int64_t Padding(const ConvLayerConfig& layer) { return layer.padding >= 0 ? layer.padding : layer.kernel / 2; }

torch::Tensor GlorotUniform(std::vector<int64_t> shape, int64_t fan_in, int64_t fan_out, at::Generator& generator) {
  const double limit = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return torch::empty(shape).uniform_(-limit, limit, generator);
}

}  // namespace

std::vector<int64_t> CnnFeatureShape(const CnnConfig& config) {
  int64_t channels = config.input_shape[0], height = config.input_shape[1], width = config.input_shape[2];
  for (const ConvLayerConfig& layer : config.conv) {
    channels = layer.channels;
    height = (height + 2 * Padding(layer) - layer.kernel) / layer.stride + 1;
    width = (width + 2 * Padding(layer) - layer.kernel) / layer.stride + 1;
    if (layer.pool > 1) {
      height /= layer.pool;
      width /= layer.pool;
    }
  }
  return {channels, height, width};
}

absl::Status ValidateCnnConfig(const CnnConfig& config) {
  if (config.input_shape.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat("model.input_shape has ", config.input_shape.size(),
                                                   " dimensions; the cnn takes [channels, height, width]"));
  }
  for (int64_t d : config.input_shape) {
    if (d <= 0) return absl::InvalidArgumentError("model.input_shape: every dimension must be positive");
  }
  if (config.conv.empty()) return absl::InvalidArgumentError("model.conv: the cnn needs at least one layer");
  int64_t height = config.input_shape[1], width = config.input_shape[2];
  for (size_t i = 0; i < config.conv.size(); ++i) {
    const ConvLayerConfig& layer = config.conv[i];
    const std::string key = absl::StrCat("model.conv[", i, "]");
    if (layer.channels <= 0 || layer.kernel <= 0 || layer.stride <= 0 || layer.pool < 0 || layer.padding < -1) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": channels, kernel and stride must be positive, pool and padding not negative"));
    }
    height = (height + 2 * Padding(layer) - layer.kernel) / layer.stride + 1;
    width = (width + 2 * Padding(layer) - layer.kernel) / layer.stride + 1;
    if (layer.pool > 1) {
      height /= layer.pool;
      width /= layer.pool;
    }
    if (height <= 0 || width <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(key, " leaves no image: ", height, " x ", width,
                                                     " after its kernel, stride and pool"));
    }
  }
  for (size_t i = 0; i < config.dense.size(); ++i) {
    if (config.dense[i] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("model.dense[", i, "] = ", config.dense[i], " must be positive"));
    }
  }
  if (config.classes < 2) return absl::InvalidArgumentError("model.classes must be at least 2");
  if (config.dropout < 0 || config.dropout >= 1) return absl::InvalidArgumentError("model.dropout must be in [0, 1)");
  if (config.batch_norm_momentum <= 0 || config.batch_norm_momentum > 1) {
    return absl::InvalidArgumentError("model.batch_norm_momentum must be in (0, 1]");
  }
  return absl::OkStatus();
}

torch::Tensor Cnn::AddVariable(const std::string& name, torch::Tensor value) {
  names_.push_back(scope_ + name);
  params_.push_back(value.requires_grad_(true));
  return params_.back();
}

torch::Tensor Cnn::AddBuffer(const std::string& name, torch::Tensor value) {
  buffer_names_.push_back(scope_ + name);
  buffers_.push_back(value);
  return buffers_.back();
}

Cnn::Cnn(const CnnConfig& config, uint64_t seed, const std::string& scope) : config_(config), scope_(scope) {
  torch::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  int64_t channels = config.input_shape[0];
  for (size_t k = 0; k < config.conv.size(); ++k) {
    const ConvLayerConfig& layer = config.conv[k];
    const int64_t window = layer.kernel * layer.kernel;
    const std::string conv = absl::StrCat("conv_", k + 1), bn = absl::StrCat("bn_", k + 1);
    ConvLayer built;
    built.kernel = AddVariable(conv + "/kernel", GlorotUniform({layer.channels, channels, layer.kernel, layer.kernel},
                                                               channels * window, layer.channels * window, generator));
    built.bias = AddVariable(conv + "/bias", torch::zeros({layer.channels}));
    if (config.batch_norm) {
      built.gamma = AddVariable(bn + "/gamma", torch::ones({layer.channels}));
      built.beta = AddVariable(bn + "/beta", torch::zeros({layer.channels}));
      built.mean = AddBuffer(bn + "/moving_mean", torch::zeros({layer.channels}));
      built.variance = AddBuffer(bn + "/moving_variance", torch::ones({layer.channels}));
      built.batches_tracked = AddBuffer(bn + "/num_batches_tracked", torch::zeros({}, torch::kInt64));
    }
    conv_.push_back(built);
    channels = layer.channels;
  }
  const std::vector<int64_t> features = CnnFeatureShape(config);
  int64_t in = features[0] * features[1] * features[2];
  std::vector<int64_t> outs = config.dense;
  outs.push_back(config.classes);
  for (size_t k = 0; k < outs.size(); ++k) {
    const std::string dense = absl::StrCat("dense_", k + 1);
    DenseLayer built;
    built.kernel = AddVariable(dense + "/kernel", GlorotUniform({in, outs[k]}, in, outs[k], generator));
    built.bias = AddVariable(dense + "/bias", torch::zeros({outs[k]}));
    dense_.push_back(built);
    in = outs[k];
  }
}

torch::Tensor Cnn::Forward(const torch::Tensor& input) {
  // Examples arrive as [N, C, H, W], or flat (the MLP's layout) when their
  // sizes multiply to the input shape's.
  const auto& shape = config_.input_shape;
  torch::Tensor h = input.dim() == 4 ? input : input.reshape({input.size(0), shape[0], shape[1], shape[2]});
  for (size_t k = 0; k < conv_.size(); ++k) {
    const ConvLayerConfig& layer = config_.conv[k];
    const ConvLayer& c = conv_[k];
    h = torch::conv2d(h, c.kernel, c.bias, layer.stride, Padding(layer));
    if (config_.batch_norm) {
      h = torch::batch_norm(h, c.gamma, c.beta, c.mean, c.variance, training_, config_.batch_norm_momentum,
                            kBatchNormEpsilon, /*cudnn_enabled=*/false);
      if (training_) {
        torch::NoGradGuard no_grad;
        c.batches_tracked.add_(1);
      }
    }
    h = torch::relu(h);
    if (layer.pool > 1) h = torch::max_pool2d(h, layer.pool, layer.pool);
  }
  h = h.flatten(1);
  for (size_t k = 0; k < dense_.size(); ++k) {
    if (k > 0 && config_.dropout > 0) h = torch::dropout(h, config_.dropout, training_);
    h = torch::addmm(dense_[k].bias, h, dense_[k].kernel);
    if (k + 1 < dense_.size()) h = torch::relu(h);
  }
  return h;
}

absl::StatusOr<torch::jit::Module> Cnn::Script() const {
  ScriptBuilder builder("Cnn");
  const size_t scope = scope_.size();
  std::vector<std::string> variables, buffers;
  for (size_t i = 0; i < params_.size(); ++i) variables.push_back(builder.AddParameter(names_[i].substr(scope), params_[i]));
  for (size_t i = 0; i < buffers_.size(); ++i) {
    buffers.push_back(builder.AddBuffer(buffer_names_[i].substr(scope), buffers_[i]));
  }
  const auto& shape = config_.input_shape;
  std::string source = absl::StrCat("def forward(self, x: Tensor) -> Tensor:\n",
                                    "    h = x if x.dim() == 4 else x.reshape([x.size(0), ", shape[0], ", ", shape[1],
                                    ", ", shape[2], "])\n");
  size_t v = 0, b = 0;  // the next variable and buffer, in the order the constructor added them
  for (const ConvLayerConfig& layer : config_.conv) {
    absl::StrAppend(&source, "    h = torch.conv2d(h, self.", variables[v], ", self.", variables[v + 1], ", [",
                    layer.stride, ", ", layer.stride, "], [", Padding(layer), ", ", Padding(layer), "])\n");
    v += 2;
    if (config_.batch_norm) {
      absl::StrAppend(&source, "    h = torch.batch_norm(h, self.", variables[v], ", self.", variables[v + 1],
                      ", self.", buffers[b], ", self.", buffers[b + 1], ", False, ", config_.batch_norm_momentum,
                      ", ", kBatchNormEpsilon, ", False)\n");
      v += 2;
      b += 3;
    }
    absl::StrAppend(&source, "    h = torch.relu(h)\n");
    if (layer.pool > 1) {
      absl::StrAppend(&source, "    h = torch.max_pool2d(h, [", layer.pool, ", ", layer.pool, "], [", layer.pool, ", ",
                      layer.pool, "])\n");
    }
  }
  absl::StrAppend(&source, "    h = h.flatten(1)\n");
  for (size_t k = 0; k < dense_.size(); ++k, v += 2) {
    absl::StrAppend(&source, "    h = torch.addmm(self.", variables[v + 1], ", h, self.", variables[v], ")\n");
    if (k + 1 < dense_.size()) absl::StrAppend(&source, "    h = torch.relu(h)\n");
  }
  absl::StrAppend(&source, "    return h\n");
  return builder.Finish(source);
}

}  // namespace shoal
