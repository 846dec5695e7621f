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

const std::vector<std::string>& Model::buffer_names() const {
  static const std::vector<std::string> none;
  return none;
}

const std::vector<torch::Tensor>& Model::buffers() const {
  static const std::vector<torch::Tensor> none;
  return none;
}

std::vector<VariableSpec> Model::BufferSpecs() const {
  std::vector<VariableSpec> specs;
  for (size_t i = 0; i < buffers().size(); ++i) {
    specs.push_back({buffer_names()[i], std::vector<int64_t>(buffers()[i].sizes().begin(), buffers()[i].sizes().end())});
  }
  return specs;
}

std::vector<torch::Tensor> Model::BufferValues() const {
  std::vector<torch::Tensor> values;
  for (const auto& b : buffers()) values.push_back(b.detach().clone());
  return values;
}

void Model::LoadBuffers(const std::vector<torch::Tensor>& values) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers().size(); ++i) buffers()[i].copy_(values[i]);
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
