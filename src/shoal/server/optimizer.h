// Optimizer: the update rule a server applies to one variable.
//
// Validation is kept apart from math, as TensorFlow's training kernels do:
// Create() checks the hyper-parameters once, and Apply() trusts its input
// (the VariableStore has already checked the gradient's shape and values).
// The update math follows torch::optim op for op, so a variable trained on a
// shoal server and a parameter trained by torch::optim with the same gradients
// agree to float rounding.
//
// Defaults (when a field of OptimizerConfig is 0/unset):
//   sgd       learning_rate 0.01
//   momentum  learning_rate 0.01, momentum 0.9, nesterov false
//   adagrad   learning_rate 0.01, initial_accumulator_value 0.1, epsilon 1e-10
//   adam      learning_rate 0.001, beta1 0.9, beta2 0.999, epsilon 1e-8
//   rmsprop   learning_rate 0.01, decay 0.99, epsilon 1e-8, momentum 0, centered false
// weight_decay (L2, added to the gradient) defaults to 0 for all, and so does
// learning-rate decay (lr_decay_rate, lr_decay_steps: exponential, per
// variable apply count). A field set to 0 takes its default.
//
// An Optimizer is immutable and may be shared; per-variable state lives in
// OptimizerSlots, which the caller guards (or not: Hogwild).
#ifndef SHOAL_SERVER_OPTIMIZER_H_
#define SHOAL_SERVER_OPTIMIZER_H_

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/wire.pb.h"

namespace shoal {

// The state an optimizer keeps beside one variable ("slots" in TensorFlow).
struct OptimizerSlots {
  std::vector<torch::Tensor> tensors;  // e.g. Adam's m and v
  int64_t step = 0;                    // applies so far (bias correction)
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // Validates `config` and fills in defaults. Errors name the bad field.
  static absl::StatusOr<std::shared_ptr<const Optimizer>> Create(const wire::OptimizerConfig& config);

  // The configuration with every default filled in.
  const wire::OptimizerConfig& config() const { return config_; }

  // Allocates the slots for a variable shaped like `value`. Every slot is a
  // defined tensor (they are read, saved and assigned as they are).
  virtual OptimizerSlots MakeSlots(const torch::Tensor& value) const = 0;

  // Adds the slots `slots` lacks for this configuration, as zeros or the
  // optimizer's initial value (momentum set where the variable was made
  // without it); keeps every slot it has. For a set_optimizer.
  void AddMissingSlots(const torch::Tensor& value, OptimizerSlots* slots) const;

  // value -= update(grad). `grad` has value's shape and is finite.
  virtual void Apply(torch::Tensor& value, const torch::Tensor& grad, OptimizerSlots& slots) const = 0;

 // Use Create(), which validates `config`; this trusts it.
  explicit Optimizer(wire::OptimizerConfig config) : config_(std::move(config)) {}

 protected:
  torch::Tensor WithWeightDecay(const torch::Tensor& value, const torch::Tensor& grad) const;
  // The learning rate after `applies` updates, with decay if configured.
  double LearningRate(int64_t applies) const;

 private:
  wire::OptimizerConfig config_;
};

}  // namespace shoal

#endif  // SHOAL_SERVER_OPTIMIZER_H_
