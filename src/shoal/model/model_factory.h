// The model `model:` in the config asks for: the built-in MLP or CNN (from
// their keys), a TorchScript file, or a C++ module a program handed over
// through its API (kind `module`, never from a file).
#ifndef SHOAL_MODEL_MODEL_FACTORY_H_
#define SHOAL_MODEL_MODEL_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "shoal/model/click_model.h"
#include "shoal/model/cnn.h"
#include "shoal/model/mlp.h"
#include "shoal/model/model.h"
#include "shoal/model/module_model.h"

namespace shoal {

struct ModelConfig : MlpConfig {
  std::string kind = "mlp";  // mlp | cnn | torchscript | click | module
  std::string path;          // torchscript (click: its dense part): the module saved with torch.jit.save
  // module: how to build it; set by the C++ API, never parsed or written out,
  // and only in-process (a task process could not build it).
  std::shared_ptr<const ModuleFactory> module;
  CnnConfig cnn;             // cnn: its layers (seed and scope are MlpConfig's)
  ClickConfig click;         // click: its table and dense part
  // cross_entropy (int64 class labels) | mse (float32 targets) | logistic
  // (float32 0/1 labels; the click model's, and only its)
  std::string loss = "cross_entropy";
};

// The kind is known, and has what it needs (layers, or a path).
absl::Status ValidateModelConfig(const ModelConfig& config);

// One line for logs: "mlp 784-256-128-10", "cnn conv 32-64 dense 128 (BatchNorm)", "torchscript net.pt",
// "click wide_deep, table 1000000 x 16".
std::string ModelSummary(const ModelConfig& config);

// A fresh model: the built-in models' initial values come from the seed, a
// TorchScript module's from its file. `config.scope` prefixes every variable name.
absl::StatusOr<std::unique_ptr<Model>> MakeModel(const ModelConfig& config);

}  // namespace shoal

#endif  // SHOAL_MODEL_MODEL_FACTORY_H_
