// ModuleModel: a torch::nn::Module that a C++ program defines and hands to
// shoal (include/shoal/shoal.h, shoal::Module), trained like any other
// model. Its variables are its parameters as named_parameters() names them
// ("fc1.weight"), its buffers as named_buffers() does, behind the scope; its
// forward pass is the function the program gave with it, since
// torch::nn::Module has no virtual forward().
//
// Not thread-safe: one model per worker thread (MakeModel builds a fresh
// module for each through the factory).
#ifndef SHOAL_MODEL_MODULE_MODEL_H_
#define SHOAL_MODEL_MODULE_MODEL_H_

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/model/model.h"
#include "shoal/module.h"  // include/: the public API's Module

namespace shoal {

// How to build a program's module and run it (the public API's type):
// `make` is called once per model under torch::manual_seed(model.seed), so
// that every copy starts from the same values.
using ModuleFactory = ::shoal::Module;

class ModuleModel : public Model {
 public:
  // InvalidArgument naming the module for a factory that returns nothing or
  // throws, a module without parameters, a parameter that is not float32 or
  // a buffer that is neither float32 nor int64.
  static absl::StatusOr<std::unique_ptr<ModuleModel>> Create(const ModuleFactory& factory, int64_t seed,
                                                             const std::string& scope);

  const std::vector<std::string>& variable_names() const override { return names_; }
  const std::vector<torch::Tensor>& variables() const override { return params_; }
  const std::vector<std::string>& buffer_names() const override { return buffer_names_; }
  const std::vector<torch::Tensor>& buffers() const override { return buffers_; }
  torch::Tensor Forward(const torch::Tensor& input) override { return forward_(*module_, input); }
  void SetTraining(bool training) override { module_->train(training); }
  // Unimplemented: a C++ torch::nn::Module has no TorchScript form.
  absl::StatusOr<torch::jit::Module> Script() const override;

 private:
  ModuleModel() = default;

  std::shared_ptr<torch::nn::Module> module_;
  std::string name_;
  std::function<torch::Tensor(torch::nn::Module&, const torch::Tensor&)> forward_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> buffer_names_;
  std::vector<torch::Tensor> buffers_;
};

}  // namespace shoal

#endif  // SHOAL_MODEL_MODULE_MODEL_H_
