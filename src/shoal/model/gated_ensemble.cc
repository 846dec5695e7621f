#include "shoal/model/gated_ensemble.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"

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

// [in, hidden..., out] as an MlpConfig under `scope`.
MlpConfig PartConfig(const MlpConfig& base, int64_t in, const std::vector<int64_t>& hidden, int64_t out,
                     const std::string& scope, uint64_t seed) {
  MlpConfig part = base;
  part.layers = {in};
  part.layers.insert(part.layers.end(), hidden.begin(), hidden.end());
  if (out > 0) part.layers.push_back(out);
  part.scope = scope;
  part.seed = seed;
  return part;
}

}  // namespace

absl::StatusOr<GatedModelConfig> ResolveGatedConfig(const GatedModelConfig& config, const MlpConfig& base,
                                                    int num_workers) {
  GatedModelConfig resolved = config;
  if (resolved.networks.empty()) {
    const std::vector<int64_t> hidden(base.layers.begin() + 1, base.layers.end() - 1);
    resolved.networks.assign(num_workers, hidden);
  }
  if (resolved.networks.size() < 2) {
    return absl::InvalidArgumentError(
        "config: a gated ensemble needs at least 2 networks: list them in 'gated.networks' or run 2 or more workers");
  }
  for (size_t k = 0; k < resolved.networks.size(); ++k) {
    auto status = CheckSizes(absl::StrCat("gated.networks[", k, "]"), resolved.networks[k]);
    if (!status.ok()) return status;
  }
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

GatedEnsemble::GatedEnsemble(const MlpConfig& base, const GatedModelConfig& config) : config_(config) {
  const int64_t input = base.layers.front(), classes = base.layers.back();
  int64_t features = input;
  if (!config.trunk.empty()) {
    MlpConfig trunk = PartConfig(base, input, config.trunk, 0, "trunk/", base.seed * 7919 + 1);
    trunk.activate_output = true;
    trunk_ = std::make_unique<Mlp>(trunk);
    features = config.trunk.back();
  }
  for (size_t k = 0; k < config.networks.size(); ++k) {
    networks_.push_back(std::make_unique<Mlp>(PartConfig(base, features, config.networks[k], classes,
                                                         absl::StrCat("net_", k, "/"), base.seed * 7919 + 2 + k)));
  }
  const int64_t master_input = num_networks() * classes + (config.master_sees_input ? input : 0);
  master_ = std::make_unique<Mlp>(
      PartConfig(base, master_input, config.master_hidden, num_networks(), "master/", base.seed * 7919 + 1000));
  std::vector<const Mlp*> parts;
  if (trunk_) parts.push_back(trunk_.get());
  for (const auto& n : networks_) parts.push_back(n.get());
  parts.push_back(master_.get());
  for (const Mlp* part : parts) {
    names_.insert(names_.end(), part->variable_names().begin(), part->variable_names().end());
    variables_.insert(variables_.end(), part->variables().begin(), part->variables().end());
  }
}

std::vector<VariableSpec> GatedEnsemble::VariableSpecs() const {
  std::vector<VariableSpec> specs;
  for (size_t i = 0; i < variables_.size(); ++i) {
    specs.push_back({names_[i], std::vector<int64_t>(variables_[i].sizes().begin(), variables_[i].sizes().end())});
  }
  return specs;
}

void GatedEnsemble::Load(const std::vector<torch::Tensor>& values) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < variables_.size(); ++i) variables_[i].copy_(values[i]);
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

torch::Tensor GatedEnsemble::Predict(const torch::Tensor& images) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> logits;
  for (int k = 0; k < num_networks(); ++k) logits.push_back(NetworkLogits(k, images));
  return WeightedVote(logits, MasterWeights(logits, images));
}

GatedAccuracy GatedEnsemble::Evaluate(const Dataset& data, int64_t batch_size) {
  torch::NoGradGuard no_grad;
  int64_t gated = 0, uniform = 0, any_right = 0;
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
    weight_sums += weights.sum(0).to(torch::kFloat64);
  }
  const double total = std::max<int64_t>(data.size(), 1);
  GatedAccuracy accuracy;
  accuracy.gated_vote = gated / total;
  accuracy.uniform_average = uniform / total;
  for (int64_t a : alone) accuracy.networks.push_back(a / total);
  accuracy.any_right = any_right / total;
  for (int k = 0; k < num_networks(); ++k) accuracy.mean_weights.push_back(weight_sums[k].item<double>() / total);
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
