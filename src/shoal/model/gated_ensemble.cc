#include "shoal/model/gated_ensemble.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shoal/core/status.h"
#include "shoal/model/script_builder.h"

namespace shoal {
namespace {

absl::Status CheckSizes(const std::string& key, const std::vector<int64_t>& sizes) {
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("config: '", key, "[", i, "]' = ", sizes[i], " must be positive"));
    }
  }
  return absl::OkStatus();
}

// [in, hidden..., out] as an MLP under `scope`.
ModelConfig MlpPart(const ModelConfig& base, int64_t in, const std::vector<int64_t>& hidden, int64_t out,
                    const std::string& scope, uint64_t seed) {
  ModelConfig part;
  part.kind = "mlp";
  part.activation = base.activation;
  part.layers = {in};
  part.layers.insert(part.layers.end(), hidden.begin(), hidden.end());
  if (out > 0) part.layers.push_back(out);
  part.scope = scope;
  part.seed = seed;
  return part;
}

// The input width (one example, flattened) and the classes that `model:`
// gives the built-in parts.
int64_t InputFeatures(const ModelConfig& base) {
  if (base.kind != "cnn") return base.layers.front();
  int64_t features = 1;
  for (int64_t d : base.cnn.input_shape) features *= d;
  return features;
}
int64_t Classes(const ModelConfig& base) { return base.kind == "cnn" ? base.cnn.classes : base.layers.back(); }

// Network k's own model, under its scope, a built-in one seeded apart.
ModelConfig NetworkModel(const ModelConfig& base, const GatedModelConfig& config, int64_t features, size_t k) {
  const std::string scope = absl::StrCat("net_", k, "/");
  const uint64_t seed = base.seed * 7919 + 2 + k;
  const GatedNetworkConfig& network = config.networks[k];
  if (!network.model) return MlpPart(base, features, network.hidden, Classes(base), scope, seed);
  ModelConfig model = *network.model;
  model.scope = scope;
  model.seed = seed;
  return model;
}

ModelConfig MasterModel(const ModelConfig& base, const GatedModelConfig& config) {
  const int64_t networks = static_cast<int64_t>(config.networks.size());
  if (!config.master) {
    const int64_t input = networks * Classes(base) + (config.master_sees_input ? InputFeatures(base) : 0);
    return MlpPart(base, input, config.master_hidden, networks, "master/", base.seed * 7919 + 1000);
  }
  ModelConfig master = *config.master;
  master.scope = "master/";
  master.seed = base.seed * 7919 + 1000;
  return master;
}

// A part's own model config, checked, with the part named in the error.
absl::Status CheckPart(const std::string& key, const ModelConfig& model) {
  SHOAL_RETURN_IF_ERROR(Annotate(ValidateModelConfig(model), key));
  if (model.loss != "cross_entropy") {
    return absl::InvalidArgumentError(absl::StrCat(key, ": the parts of a gated ensemble are classifiers; loss '",
                                                   model.loss, "' is not cross_entropy"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string GatedSummary(const ModelConfig& base, const GatedModelConfig& config) {
  std::vector<std::string> networks;
  int64_t features = InputFeatures(base);
  if (!config.trunk.empty()) features = config.trunk.back();
  for (size_t k = 0; k < config.networks.size(); ++k) {
    networks.push_back(ModelSummary(NetworkModel(base, config, features, k)));
  }
  return absl::StrCat(networks.size(), " networks (", absl::StrJoin(networks, "; "), "), ",
                      config.trunk.empty() ? "" : absl::StrCat("trunk ", absl::StrJoin(config.trunk, "-"), ", "),
                      "master ", ModelSummary(MasterModel(base, config)));
}

absl::StatusOr<GatedModelConfig> ResolveGatedConfig(const GatedModelConfig& config, const ModelConfig& base,
                                                    int num_workers) {
  GatedModelConfig resolved = config;
  if (base.kind == "torchscript") {
    return absl::InvalidArgumentError(
        "config: in mode gated, model: gives the built-in parts' input and class widths (kind mlp or cnn); "
        "list TorchScript networks in 'gated.networks' ({kind: torchscript, path: ...}, one file each)");
  }
  if (resolved.networks.empty()) {
    GatedNetworkConfig network;
    if (base.kind == "mlp") {
      network.hidden.assign(base.layers.begin() + 1, base.layers.end() - 1);
    } else {
      network.model = base;
    }
    resolved.networks.assign(num_workers, network);
  }
  if (resolved.networks.size() < 2) {
    return absl::InvalidArgumentError(
        "config: a gated ensemble needs at least 2 networks: list them in 'gated.networks' or run 2 or more workers");
  }
  for (size_t k = 0; k < resolved.networks.size(); ++k) {
    const std::string key = absl::StrCat("gated.networks[", k, "]");
    const GatedNetworkConfig& network = resolved.networks[k];
    if (network.model) {
      SHOAL_RETURN_IF_ERROR(CheckPart(absl::StrCat("config: '", key, "'"), *network.model));
      if (!resolved.trunk.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("config: 'gated.trunk' feeds MLP networks given by their "
                                                       "hidden sizes; '", key, "' is ", ModelSummary(*network.model)));
      }
    }
    auto status = CheckSizes(key, network.hidden);
    if (!status.ok()) return status;
  }
  if (resolved.master) SHOAL_RETURN_IF_ERROR(CheckPart("config: 'gated.master'", *resolved.master));
  for (auto [key, sizes] : {std::pair{"gated.trunk", &resolved.trunk},
                            std::pair{"gated.master_hidden", &resolved.master_hidden}}) {
    auto status = CheckSizes(key, *sizes);
    if (!status.ok()) return status;
  }
  for (auto [key, value, known] :
       {std::tuple{"gated.output", resolved.output, std::vector<std::string>{"softmax", "sigmoid"}},
        std::tuple{"gated.scale", resolved.scale, std::vector<std::string>{"batch_mean", "per_sample"}},
        std::tuple{"gated.master_loss", resolved.master_loss, std::vector<std::string>{"mse", "cross_entropy"}}}) {
    if (std::find(known.begin(), known.end(), value) == known.end()) {
      return absl::InvalidArgumentError(absl::StrCat("config: '", key, "' '", value, "' is unknown; known: ",
                                                     known[0], ", ", known[1]));
    }
  }
  if (resolved.master_loss == "cross_entropy" && resolved.output != "softmax") {
    return absl::InvalidArgumentError(
        "config: 'gated.master_loss' cross_entropy compares a distribution over the networks: it needs "
        "'gated.output' softmax");
  }
  const int workers = num_workers;
  if (workers != 1 && workers != static_cast<int>(resolved.networks.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: 'gated.networks' has ", resolved.networks.size(), " networks but the cluster has ", workers,
        " workers: run one worker per network, or 1 worker to train the whole ensemble in one task"));
  }
  return resolved;
}

absl::StatusOr<std::unique_ptr<GatedEnsemble>> GatedEnsemble::Create(const ModelConfig& base,
                                                                    const GatedModelConfig& config) {
  std::unique_ptr<GatedEnsemble> ensemble(new GatedEnsemble(config, Classes(base)));
  int64_t features = InputFeatures(base);
  if (!config.trunk.empty()) {
    ModelConfig trunk = MlpPart(base, features, config.trunk, 0, "trunk/", base.seed * 7919 + 1);
    trunk.activate_output = true;
    ensemble->trunk_ = std::make_unique<Mlp>(trunk);
    features = config.trunk.back();
  }
  for (size_t k = 0; k < config.networks.size(); ++k) {
    SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> network, MakeModel(NetworkModel(base, config, features, k)));
    ensemble->networks_.push_back(std::move(network));
  }
  SHOAL_ASSIGN_OR_RETURN(ensemble->master_, MakeModel(MasterModel(base, config)));
  std::vector<const Model*> parts;
  if (ensemble->trunk_) parts.push_back(ensemble->trunk_.get());
  for (const auto& n : ensemble->networks_) parts.push_back(n.get());
  parts.push_back(ensemble->master_.get());
  for (const Model* part : parts) {
    ensemble->names_.insert(ensemble->names_.end(), part->variable_names().begin(), part->variable_names().end());
    ensemble->variables_.insert(ensemble->variables_.end(), part->variables().begin(), part->variables().end());
    ensemble->buffer_names_.insert(ensemble->buffer_names_.end(), part->buffer_names().begin(),
                                   part->buffer_names().end());
    ensemble->buffers_.insert(ensemble->buffers_.end(), part->buffers().begin(), part->buffers().end());
  }
  return ensemble;
}

std::vector<VariableSpec> GatedEnsemble::VariableSpecs() const {
  std::vector<VariableSpec> specs;
  for (size_t i = 0; i < variables_.size(); ++i) {
    specs.push_back({names_[i], std::vector<int64_t>(variables_[i].sizes().begin(), variables_[i].sizes().end())});
  }
  for (size_t i = 0; i < buffers_.size(); ++i) {
    specs.push_back({buffer_names_[i], std::vector<int64_t>(buffers_[i].sizes().begin(), buffers_[i].sizes().end())});
  }
  return specs;
}

std::vector<torch::Tensor> GatedEnsemble::BufferValues() const {
  std::vector<torch::Tensor> values;
  for (const auto& b : buffers_) values.push_back(b.detach().clone());
  return values;
}

void GatedEnsemble::Load(const std::vector<torch::Tensor>& values) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < variables_.size(); ++i) variables_[i].copy_(values[i]);
}

void GatedEnsemble::LoadBuffers(const std::vector<torch::Tensor>& values) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].copy_(values[i]);
}

void GatedEnsemble::SetTraining(bool training) {
  if (trunk_) trunk_->SetTraining(training);
  for (auto& n : networks_) n->SetTraining(training);
  master_->SetTraining(training);
}

absl::Status GatedEnsemble::CheckShapes(const Dataset& data) {
  if (data.size() == 0) return absl::OkStatus();
  if (data.labels.scalar_type() != torch::kInt64) {
    return absl::InvalidArgumentError("mode gated trains classifiers: the data's labels must be int64 classes");
  }
  const int64_t largest_label = data.labels.max().item<int64_t>();
  if (largest_label >= classes_) {
    return absl::InvalidArgumentError(absl::StrCat("gated: the data has label ", largest_label, " but model: gives ",
                                                   classes_, " classes"));
  }
  const torch::Tensor sample = data.images.narrow(0, 0, std::min<int64_t>(2, data.size()));
  torch::NoGradGuard no_grad;
  SetTraining(false);
  std::vector<torch::Tensor> logits;
  absl::Status status;
  for (int k = 0; k < num_networks() && status.ok(); ++k) {
    const std::string what = absl::StrCat("gated.networks[", k, "]");
    auto features = trunk_ ? ForwardOrError(*trunk_, sample, "gated.trunk") : absl::StatusOr<torch::Tensor>(sample);
    auto out = features.ok() ? ForwardOrError(*networks_[k], *features, what) : features;
    if (!out.ok()) {
      status = out.status();
    } else if (out->dim() != 2 || out->size(0) != sample.size(0) || out->size(1) != classes_) {
      status = absl::InvalidArgumentError(absl::StrCat(what, ": forward() maps a batch of shape ", ShapeString(sample.sizes()),
                                                       " to ", ShapeString(out->sizes()), "; expected [", sample.size(0),
                                                       ", ", classes_, "] logits (the classes model: gives)"));
    } else {
      logits.push_back(*out);
    }
  }
  if (status.ok()) {
    std::vector<torch::Tensor> inputs = logits;
    if (config_.master_sees_input) inputs.push_back(sample.flatten(1));
    const torch::Tensor input = torch::cat(inputs, 1);
    auto out = ForwardOrError(*master_, input, "gated.master");
    if (!out.ok()) {
      status = out.status();
    } else if (out->dim() != 2 || out->size(0) != sample.size(0) || out->size(1) != num_networks()) {
      status = absl::InvalidArgumentError(absl::StrCat("gated.master: forward() maps the networks' logits ",
                                                       ShapeString(input.sizes()), " to ", ShapeString(out->sizes()),
                                                       "; expected one weight per network, [", sample.size(0), ", ",
                                                       num_networks(), "]"));
    }
  }
  SetTraining(true);
  return status;
}

torch::Tensor GatedEnsemble::NetworkLogits(int k, const torch::Tensor& images) {
  return networks_[k]->Forward(trunk_ ? trunk_->Forward(images) : images);
}

torch::Tensor GatedEnsemble::MasterWeights(const std::vector<torch::Tensor>& logits, const torch::Tensor& images) {
  std::vector<torch::Tensor> inputs = logits;
  if (config_.master_sees_input) inputs.push_back(images.flatten(1));
  torch::Tensor z = master_->Forward(torch::cat(inputs, 1));
  return config_.output == "softmax" ? torch::softmax(z, 1) : torch::sigmoid(z);
}

GatedStepResult GatedEnsemble::OneGraphStep(const torch::Tensor& images, const torch::Tensor& labels) {
  for (auto& p : variables_) p.mutable_grad().reset();
  std::vector<torch::Tensor> logits, master_input;
  for (int k = 0; k < num_networks(); ++k) {
    logits.push_back(NetworkLogits(k, images));
    master_input.push_back(config_.master_loss_to_workers ? logits.back() : logits.back().detach());
  }
  GatedStepResult result;
  result.weights = MasterWeights(master_input, images);
  torch::Tensor master_loss = MasterLoss(result.weights, Correctness(logits, labels), config_.master_loss);
  const torch::Tensor scales = NetworkScales(result.weights, config_.scale);
  torch::Tensor total = master_loss;
  for (int k = 0; k < num_networks(); ++k) {
    total = total + ScaledNetworkLoss(logits[k], labels, scales.select(1, k));
    torch::NoGradGuard no_grad;
    result.network_losses.push_back(CrossEntropyLoss(logits[k], labels).item<double>());
    result.network_accuracies.push_back(logits[k].argmax(1).eq(labels).to(torch::kFloat64).mean().item<double>());
  }
  total.backward();
  result.master_loss = master_loss.item<double>();
  result.weights = result.weights.detach();
  for (const auto& p : variables_) result.gradients.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  return result;
}

absl::StatusOr<torch::jit::Module> GatedEnsemble::Script() const {
  ScriptBuilder builder("GatedEnsemble");
  std::string source = "def forward(self, x: Tensor) -> Tensor:\n    h = x\n";
  if (trunk_) {
    SHOAL_ASSIGN_OR_RETURN(torch::jit::Module trunk, trunk_->Script());
    builder.AddModule("trunk", trunk);
    absl::StrAppend(&source, "    h = self.trunk.forward(x)\n");
  }
  std::vector<std::string> logits;
  for (int k = 0; k < num_networks(); ++k) {
    SHOAL_ASSIGN_OR_RETURN(torch::jit::Module network, networks_[k]->Script());
    builder.AddModule(absl::StrCat("net_", k), network);
    logits.push_back(absl::StrCat("logits_", k));
    absl::StrAppend(&source, "    ", logits.back(), " = self.net_", k, ".forward(h)\n");
  }
  SHOAL_ASSIGN_OR_RETURN(torch::jit::Module master, master_->Script());
  builder.AddModule("master", master);
  absl::StrAppend(&source, "    z = self.master.forward(torch.cat([", absl::StrJoin(logits, ", "),
                  config_.master_sees_input ? ", x.flatten(1)" : "", "], 1))\n", "    weights = torch.",
                  config_.output == "softmax" ? "softmax(z, 1)" : "sigmoid(z)", "\n",
                  "    votes = torch.zeros_like(logits_0)\n");
  for (int k = 0; k < num_networks(); ++k) {
    absl::StrAppend(&source, "    votes = votes.scatter_add(1, ", logits[k], ".argmax(1, True), weights[:, ", k, ":",
                    k + 1, "])\n");
  }
  absl::StrAppend(&source, "    return votes\n");
  return builder.Finish(source);
}

torch::Tensor GatedEnsemble::Predict(const torch::Tensor& images) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> logits;
  for (int k = 0; k < num_networks(); ++k) logits.push_back(NetworkLogits(k, images));
  return WeightedVote(logits, MasterWeights(logits, images));
}

GatedAccuracy GatedEnsemble::Evaluate(const Dataset& data, int64_t batch_size) {
  torch::NoGradGuard no_grad;
  SetTraining(false);
  int64_t gated = 0, uniform = 0, any_right = 0;
  double loss_sum = 0;
  std::vector<int64_t> alone(num_networks(), 0);
  torch::Tensor weight_sums = torch::zeros({num_networks()}, torch::kFloat64);
  for (int64_t begin = 0; begin < data.size(); begin += batch_size) {
    const int64_t n = std::min(batch_size, data.size() - begin);
    const torch::Tensor images = data.images.narrow(0, begin, n), labels = data.labels.narrow(0, begin, n);
    std::vector<torch::Tensor> logits;
    torch::Tensor probabilities;  // summed over the networks: the mean's argmax
    for (int k = 0; k < num_networks(); ++k) {
      logits.push_back(NetworkLogits(k, images));
      alone[k] += logits[k].argmax(1).eq(labels).sum().item<int64_t>();
      const torch::Tensor p = torch::softmax(logits[k], 1);
      probabilities = probabilities.defined() ? probabilities + p : p;
    }
    uniform += probabilities.argmax(1).eq(labels).sum().item<int64_t>();
    const torch::Tensor weights = MasterWeights(logits, images);
    gated += WeightedVote(logits, weights).eq(labels).sum().item<int64_t>();
    any_right += static_cast<int64_t>(Correctness(logits, labels).amax(1).sum().item<double>());
    torch::Tensor mixture = torch::zeros_like(logits[0]);
    const torch::Tensor normalised = weights / weights.sum(1, /*keepdim=*/true).clamp_min(1e-12);
    for (int k = 0; k < num_networks(); ++k) {
      mixture += normalised.select(1, k).unsqueeze(1) * torch::softmax(logits[k], 1);
    }
    loss_sum -= mixture.gather(1, labels.unsqueeze(1)).clamp_min(1e-12).log().sum().item<double>();
    weight_sums += weights.sum(0).to(torch::kFloat64);
  }
  const double total = std::max<int64_t>(data.size(), 1);
  GatedAccuracy accuracy;
  accuracy.gated_vote = gated / total;
  accuracy.uniform_average = uniform / total;
  for (int64_t a : alone) accuracy.networks.push_back(a / total);
  accuracy.any_right = any_right / total;
  accuracy.mixture_loss = loss_sum / total;
  for (int k = 0; k < num_networks(); ++k) accuracy.mean_weights.push_back(weight_sums[k].item<double>() / total);
  SetTraining(true);
  return accuracy;
}

torch::Tensor Correctness(const std::vector<torch::Tensor>& logits, const torch::Tensor& labels) {
  std::vector<torch::Tensor> columns;
  for (const auto& l : logits) columns.push_back(l.detach().argmax(1).eq(labels).to(torch::kFloat32));
  return torch::stack(columns, 1);
}

torch::Tensor MasterLoss(const torch::Tensor& weights, const torch::Tensor& correctness, const std::string& kind) {
  if (kind == "mse") return (weights - correctness).square().mean();
  // Cross-entropy against correctness normalised per example; an example no
  // network gets right asks for equal weights (the master has nothing to
  // prefer there, and the vote falls back to the uniform one).
  const torch::Tensor right = correctness.sum(1, /*keepdim=*/true);
  const torch::Tensor uniform = torch::full_like(correctness, 1.0 / static_cast<double>(correctness.size(1)));
  const torch::Tensor target = torch::where(right > 0, correctness / right.clamp_min(1), uniform);
  return -(target * torch::log(weights.clamp_min(1e-12))).sum(1).mean();
}

torch::Tensor NetworkScales(const torch::Tensor& weights, const std::string& scale) {
  const torch::Tensor w = weights.detach();
  if (scale == "per_sample") return w;
  return w.mean(0, /*keepdim=*/true).expand_as(w);
}

torch::Tensor ScaledNetworkLoss(const torch::Tensor& logits, const torch::Tensor& labels, const torch::Tensor& scale) {
  const torch::Tensor per_example = torch::nn::functional::cross_entropy(
      logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  return (scale * per_example).mean();
}

torch::Tensor WeightedVote(const std::vector<torch::Tensor>& logits, const torch::Tensor& weights) {
  torch::Tensor votes = torch::zeros_like(logits[0]);
  for (size_t k = 0; k < logits.size(); ++k) {
    votes.scatter_add_(1, logits[k].argmax(1, /*keepdim=*/true), weights.select(1, k).unsqueeze(1));
  }
  return votes.argmax(1);
}

}  // namespace shoal
