// Mlp: a multilayer perceptron whose parameters are bound to variable names.
//
// Layers are dense: `dense_k/kernel` is [in, out] (TensorFlow's layout, so
// names and shapes match what users of tf.layers.dense expect) and
// `dense_k/bias` is [out]; hidden layers use the activation, the last layer
// emits logits for softmax cross-entropy. An optional scope ("worker_3/")
// prefixes every name, which is how a population member owns its weights.
// Kernels start Glorot-uniform, biases at zero, from a seeded generator, so
// every task builds the same initial model.
//
// Not thread-safe: one model per worker thread.
#ifndef SHOAL_MODEL_MLP_H_
#define SHOAL_MODEL_MLP_H_

#include <torch/torch.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/model/model.h"

namespace shoal {

struct MlpConfig {
  std::vector<int64_t> layers = {784, 256, 128, 10};
  std::string activation = "relu";  // relu | tanh | sigmoid
  uint64_t seed = 1;
  std::string scope;                // prepended to every variable name
  // Apply the activation to the last layer too: the network is then a trunk
  // whose features other networks read, not a classifier.
  bool activate_output = false;
};

absl::Status ValidateMlpConfig(const MlpConfig& config);

class Mlp : public Model, public torch::nn::Module {
 public:
  // `config` must have passed ValidateMlpConfig.
  explicit Mlp(const MlpConfig& config);

  // Logits for a batch of N examples of layers.front() values each ([N, 784],
  // or images [N, 1, 28, 28], which it flattens).
  torch::Tensor Forward(const torch::Tensor& input) override;
  // forward(x) as Forward: the attributes are the variables' names behind
  // the scope ("dense_1_kernel").
  absl::StatusOr<torch::jit::Module> Script() const override;

  // Kernel and bias per layer, in creation order.
  const std::vector<std::string>& variable_names() const override { return names_; }
  const std::vector<torch::Tensor>& variables() const override { return params_; }

 private:
  MlpConfig config_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;
};

}  // namespace shoal

#endif  // SHOAL_MODEL_MLP_H_
