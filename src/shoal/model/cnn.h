// Cnn: the built-in convolutional network (model.kind cnn), all from the
// config: convolution layers, each followed by optional BatchNorm, ReLU and
// max-pooling; then dense layers with ReLU and dropout; then the logits.
//
// Variables, behind the scope:
//   conv_k/kernel [out, in, kernel, kernel] (torch's layout), conv_k/bias
//   bn_k/gamma, bn_k/beta                   (with batch_norm)
//   dense_k/kernel [in, out], dense_k/bias  (as the MLP names them)
// and buffers bn_k/moving_mean, bn_k/moving_variance (float32) and
// bn_k/num_batches_tracked (int64), updated by every training forward pass
// as torch.nn.BatchNorm2d updates them.
//
// Kernels start Glorot-uniform from the seed, biases and beta at zero, gamma
// at one, so every task builds the same initial model.
#ifndef SHOAL_MODEL_CNN_H_
#define SHOAL_MODEL_CNN_H_

#include <torch/torch.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "shoal/model/model.h"

namespace shoal {

struct ConvLayerConfig {
  int64_t channels = 32;
  int64_t kernel = 3;
  int64_t stride = 1;
  int64_t padding = -1;  // -1: kernel / 2 ("same" at stride 1)
  int64_t pool = 2;      // max-pooling window and stride after the layer; 0 or 1: none
};

struct CnnConfig {
  std::vector<int64_t> input_shape = {1, 28, 28};  // channels, height, width of one example
  std::vector<ConvLayerConfig> conv = {{32}, {64}};
  bool batch_norm = true;
  double batch_norm_momentum = 0.1;  // torch's: running = (1 - m) * running + m * batch
  std::vector<int64_t> dense = {128};  // hidden dense layers after the convolutions
  double dropout = 0.25;               // before each dense layer but the first; 0: none
  int64_t classes = 10;
};

// Every size positive, the padding and pools such that the image does not
// vanish; names the key that is wrong.
absl::Status ValidateCnnConfig(const CnnConfig& config);

class Cnn : public Model {
 public:
  // `config` must have passed ValidateCnnConfig.
  Cnn(const CnnConfig& config, uint64_t seed, const std::string& scope);

  torch::Tensor Forward(const torch::Tensor& input) override;
  void SetTraining(bool training) override { training_ = training; }
  // forward(x) as Forward in evaluation (BatchNorm's moving statistics, no
  // dropout).
  absl::StatusOr<torch::jit::Module> Script() const override;

  const std::vector<std::string>& variable_names() const override { return names_; }
  const std::vector<torch::Tensor>& variables() const override { return params_; }
  const std::vector<std::string>& buffer_names() const override { return buffer_names_; }
  const std::vector<torch::Tensor>& buffers() const override { return buffers_; }

 private:
  struct ConvLayer {
    torch::Tensor kernel, bias, gamma, beta;
    torch::Tensor mean, variance, batches_tracked;  // BatchNorm's buffers
  };
  struct DenseLayer {
    torch::Tensor kernel, bias;
  };

  torch::Tensor AddVariable(const std::string& name, torch::Tensor value);
  torch::Tensor AddBuffer(const std::string& name, torch::Tensor value);

  CnnConfig config_;
  std::string scope_;
  bool training_ = true;
  std::vector<ConvLayer> conv_;
  std::vector<DenseLayer> dense_;
  std::vector<std::string> names_, buffer_names_;
  std::vector<torch::Tensor> params_, buffers_;
};

// The shape of one example after the convolutions and pools of `config`
// ([channels, height, width]); what the first dense layer reads, flattened.
std::vector<int64_t> CnnFeatureShape(const CnnConfig& config);

}  // namespace shoal

#endif  // SHOAL_MODEL_CNN_H_
