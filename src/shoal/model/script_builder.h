// ScriptBuilder: makes a TorchScript module in C++ from a model's trained
// tensors and the source of its forward(), so that a model trained by shoal
// leaves as a file that torch.jit.load and torch::jit::load run without
// shoal (Model::Script). Tensors are copied in: the module shares nothing
// with the model it came from.
//
// Not thread-safe: one builder per module being made.
#ifndef SHOAL_MODEL_SCRIPT_BUILDER_H_
#define SHOAL_MODEL_SCRIPT_BUILDER_H_

#include <torch/script.h>

#include <string>

#include "absl/status/statusor.h"

namespace shoal {

class ScriptBuilder {
 public:
  // `kind` names the module's class ("Mlp" makes __torch__.shoal.Mlp_<n>,
  // unique in this process).
  explicit ScriptBuilder(const std::string& kind);

  // Adds a trained tensor under an attribute name made from `variable`
  // (every character that cannot stand in a Python name becomes '_':
  // "dense_1/kernel" is self.dense_1_kernel); returns that name.
  std::string AddParameter(const std::string& variable, const torch::Tensor& value);
  std::string AddBuffer(const std::string& variable, const torch::Tensor& value);
  // A submodule, reached as self.<name>.
  void AddModule(const std::string& name, const torch::jit::Module& module);

  // Compiles `source` (TorchScript: at least `def forward(self, ...)`)
  // into the module, in evaluation mode. InvalidArgument with the
  // compiler's message when it does not compile.
  absl::StatusOr<torch::jit::Module> Finish(const std::string& source);

 private:
  std::string AddTensor(const std::string& variable, const torch::Tensor& value, bool is_buffer);

  torch::jit::Module module_;
  std::string kind_;
};

}  // namespace shoal

#endif  // SHOAL_MODEL_SCRIPT_BUILDER_H_
