// The model `model:` in the config asks for: the built-in MLP (from its
// keys) or a TorchScript file.
#ifndef SHOAL_MODEL_MODEL_FACTORY_H_
#define SHOAL_MODEL_MODEL_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "shoal/model/mlp.h"
#include "shoal/model/model.h"

namespace shoal {

struct ModelConfig : MlpConfig {
  std::string kind = "mlp";  // mlp | torchscript
  std::string path;          // torchscript: the module saved with torch.jit.save
};

// The kind is known, and has what it needs (layers, or a path).
absl::Status ValidateModelConfig(const ModelConfig& config);

// A fresh model: the MLP's initial values come from its seed, a TorchScript
// module's from its file. `config.scope` prefixes every variable name.
absl::StatusOr<std::unique_ptr<Model>> MakeModel(const ModelConfig& config);

}  // namespace shoal

#endif  // SHOAL_MODEL_MODEL_FACTORY_H_
