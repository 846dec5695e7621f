// The files a trained model leaves shoal as:
//   model.pt    a TorchScript module (Model::Script): torch.jit.load in
//               Python, torch::jit::load in C++, no shoal needed;
//   weights.pt  every trained tensor by name, a dict {name: tensor}:
//               torch.load in Python, torch::pickle_load in C++ (a model
//               with no TorchScript form leaves this alone).
// Each is written to a temporary file beside its path and renamed into
// place, so that no reader sees half a file and a failed write leaves none.
#ifndef SHOAL_EXPORT_MODEL_FILES_H_
#define SHOAL_EXPORT_MODEL_FILES_H_

#include <torch/script.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/core/file.h"  // WriteFileAtomically, WriteTextFile

namespace shoal {

absl::Status SaveScriptFile(const torch::jit::Module& module, const std::string& path);

struct NamedTensors {
  std::vector<std::string> names;
  std::vector<torch::Tensor> values;
};
absl::Status SaveWeightsFile(const NamedTensors& weights, const std::string& path);
// DataLoss naming the file for one that is not such a dict.
absl::StatusOr<NamedTensors> LoadWeightsFile(const std::string& path);

}  // namespace shoal

#endif  // SHOAL_EXPORT_MODEL_FILES_H_
