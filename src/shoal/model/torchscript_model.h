// TorchScriptModel: a module a user scripted or traced with PyTorch and saved
// (torch.jit.save), loaded with torch::jit::load. Its variables are its
// parameters, named as named_parameters() names them ("conv1.weight"),
// behind the scope; forward() takes the batch and returns the logits.
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
  // TorchScript, that has no parameters, or that has floating-point buffers
  // (BatchNorm statistics: shoal does not share buffers yet); NotFound for a
  // missing file.
  static absl::StatusOr<std::unique_ptr<TorchScriptModel>> Load(const std::string& path, const std::string& scope);

  const std::vector<std::string>& variable_names() const override { return names_; }
  const std::vector<torch::Tensor>& variables() const override { return params_; }
  torch::Tensor Forward(const torch::Tensor& input) override;
  void SetTraining(bool training) override { module_.train(training); }

 private:
  explicit TorchScriptModel(torch::jit::Module module) : module_(std::move(module)) {}

  torch::jit::Module module_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;
};

}  // namespace shoal

#endif  // SHOAL_MODEL_TORCHSCRIPT_MODEL_H_
