#include "shoal/model/model.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shoal/core/status.h"
#include "shoal/model/click_metrics.h"
#include "shoal/model/row_tables.h"

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

std::vector<std::string> Model::StateNames() const {
  std::vector<std::string> names = variable_names();
  names.insert(names.end(), buffer_names().begin(), buffer_names().end());
  return names;
}

std::vector<std::vector<int64_t>> Model::StateShapes() const {
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& v : variables()) shapes.emplace_back(v.sizes().begin(), v.sizes().end());
  for (const auto& b : buffers()) shapes.emplace_back(b.sizes().begin(), b.sizes().end());
  return shapes;
}

void Model::LoadState(const std::vector<torch::Tensor>& values) {
  const auto split = values.begin() + static_cast<std::ptrdiff_t>(variables().size());
  Load({values.begin(), split});
  LoadBuffers({split, values.end()});
}

std::vector<torch::Tensor> Model::Gradients() const {
  std::vector<torch::Tensor> grads;
  grads.reserve(variables().size());
  for (const auto& p : variables()) grads.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
  return grads;
}

absl::StatusOr<torch::jit::Module> Model::Script() const {
  return absl::UnimplementedError("this model has no TorchScript form");
}

torch::Tensor Model::Loss(const torch::Tensor& output, const torch::Tensor& labels) const {
  if (loss_ == LossKind::kMeanSquaredError) return torch::mse_loss(output.reshape(labels.sizes()), labels);
  if (loss_ == LossKind::kLogistic) {
    return torch::binary_cross_entropy_with_logits(output.reshape(labels.sizes()), labels);
  }
  return CrossEntropyLoss(output, labels);
}

absl::StatusOr<Evaluation> Evaluate(Model& model, const Dataset& data, int64_t batch_size) {
  torch::NoGradGuard no_grad;
  int64_t correct = 0;
  double loss_sum = 0;
  std::vector<torch::Tensor> probabilities;  // clicks: for the AUC
  for (int64_t begin = 0; begin < data.size(); begin += batch_size) {
    const int64_t n = std::min(batch_size, data.size() - begin);
    const torch::Tensor labels = data.labels.narrow(0, begin, n);
    const torch::Tensor input = data.images.narrow(0, begin, n);
    if (RowTables* tables = model.row_tables()) SHOAL_RETURN_IF_ERROR(tables->Pull(input));
    const torch::Tensor output = model.Forward(input);
    if (model.classifies()) correct += output.argmax(1).eq(labels).sum().item<int64_t>();
    if (model.predicts_clicks()) {
      const torch::Tensor logits = output.reshape(labels.sizes());
      correct += ClicksPredictedRight(logits, labels).sum().item<int64_t>();
      probabilities.push_back(torch::sigmoid(logits));
    }
    loss_sum += model.Loss(output, labels).item<double>() * static_cast<double>(n);
  }
  Evaluation result;
  if (data.size() > 0) {
    result.accuracy = static_cast<double>(correct) / static_cast<double>(data.size());
    result.loss = loss_sum / static_cast<double>(data.size());
  }
  if (!probabilities.empty()) {
    auto metrics = ComputeClickMetrics(torch::cat(probabilities), data.labels.to(torch::kFloat32));
    if (metrics.ok()) result.auc = metrics->auc;  // not: one class is absent
  }
  return result;
}

torch::Tensor CrossEntropyLoss(const torch::Tensor& logits, const torch::Tensor& labels) {
  return torch::nn::functional::cross_entropy(logits, labels);
}

std::string ShapeString(c10::IntArrayRef sizes) { return absl::StrCat("[", absl::StrJoin(sizes, ", "), "]"); }

absl::StatusOr<torch::Tensor> ForwardOrError(Model& model, const torch::Tensor& input, const std::string& what) {
  try {
    return model.Forward(input);
  } catch (const std::exception& e) {
    const std::string message = e.what();
    return absl::InvalidArgumentError(absl::StrCat(what, ": forward() fails on a batch of shape ",
                                                   ShapeString(input.sizes()), ": ",
                                                   message.substr(0, message.find('\n'))));
  }
}

}  // namespace shoal
