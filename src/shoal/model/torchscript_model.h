// TorchScriptModel: a module a user scripted or traced with PyTorch and saved
// (torch.jit.save), loaded with torch::jit::load. Its variables are its
// parameters, named as named_parameters() names them ("conv1.weight"), and
// its buffers as named_buffers() names them ("bn1.running_mean",
// "bn1.num_batches_tracked"), behind the scope; forward() takes the batch
// and returns the logits.
#ifndef SHOAL_MODEL_TORCHSCRIPT_MODEL_H_
#define SHOAL_MODEL_TORCHSCRIPT_MODEL_H_

#include <torch/script.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/model/model.h"

namespace shoal {

class TorchScriptModel : public Model {
 public:
  // Loads `path`. InvalidArgument naming the file for one that is not
  // TorchScript, that has no parameters, a parameter that is not float32,
  // or a buffer that is neither float32 nor int64; NotFound for a missing
  // file.
  static absl::StatusOr<std::unique_ptr<TorchScriptModel>> Load(const std::string& path, const std::string& scope);

  const std::vector<std::string>& variable_names() const override { return names_; }
  const std::vector<torch::Tensor>& variables() const override { return params_; }
  const std::vector<std::string>& buffer_names() const override { return buffer_names_; }
  const std::vector<torch::Tensor>& buffers() const override { return buffers_; }
  torch::Tensor Forward(const torch::Tensor& input) override;
  void SetTraining(bool training) override { module_.train(training); }
  // A deep copy of the loaded module, its values as they now are.
  absl::StatusOr<torch::jit::Module> Script() const override;

 private:
  explicit TorchScriptModel(torch::jit::Module module) : module_(std::move(module)) {}

  torch::jit::Module module_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> buffer_names_;
  std::vector<torch::Tensor> buffers_;
};

}  // namespace shoal

#endif  // SHOAL_MODEL_TORCHSCRIPT_MODEL_H_
