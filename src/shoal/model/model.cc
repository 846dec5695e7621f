#include "shoal/model/model.h"

namespace shoal {

std::vector<VariableSpec> Model::VariableSpecs() const {
  std::vector<VariableSpec> specs;
  const auto& params = variables();
  for (size_t i = 0; i < params.size(); ++i) {
    specs.push_back({variable_names()[i], std::vector<int64_t>(params[i].sizes().begin(), params[i].sizes().end())});
  }
  return specs;
}

int64_t Model::NumParameters() const {
  int64_t n = 0;
  for (const auto& p : variables()) n += p.numel();
  return n;
}

void Model::Load(const std::vector<torch::Tensor>& values) {
  torch::NoGradGuard no_grad;
  const auto& params = variables();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(values[i]);
}

std::vector<torch::Tensor> Model::Gradients() const {
  std::vector<torch::Tensor> grads;
  grads.reserve(variables().size());
  for (const auto& p : variables()) grads.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
  return grads;
}

torch::Tensor CrossEntropyLoss(const torch::Tensor& logits, const torch::Tensor& labels) {
  return torch::nn::functional::cross_entropy(logits, labels);
}

}  // namespace shoal
