#include "shoal/export/model_files.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "shoal/core/file.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

std::string FirstLine(const std::string& what) { return what.substr(0, what.find('\n')); }

}  // namespace

absl::Status SaveScriptFile(const torch::jit::Module& module, const std::string& path) {
  return WriteFileAtomically(path, [&module](const std::string& temporary) {
    try {
      module.save(temporary);
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("cannot write TorchScript to '", temporary, "': ", FirstLine(e.what())));
    }
    return absl::OkStatus();
  });
}

absl::Status SaveWeightsFile(const NamedTensors& weights, const std::string& path) {
  c10::Dict<std::string, at::Tensor> dict;
  for (size_t i = 0; i < weights.names.size(); ++i) dict.insert(weights.names[i], weights.values[i].detach().contiguous());
  const std::vector<char> bytes = torch::pickle_save(dict);
  return WriteBytesAtomically(path, bytes.data(), bytes.size());
}

absl::StatusOr<NamedTensors> LoadWeightsFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read weights file '", path, "'"));
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue loaded;
  try {
    loaded = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("weights file '", path, "' is damaged: ", FirstLine(e.what())));
  }
  if (!loaded.isGenericDict()) {
    return absl::DataLossError(absl::StrCat("weights file '", path, "' holds no {name: tensor} dict"));
  }
  NamedTensors weights;
  for (const auto& entry : loaded.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) {
      return absl::DataLossError(absl::StrCat("weights file '", path, "' holds an entry that is not name: tensor"));
    }
    weights.names.push_back(entry.key().toStringRef());
    weights.values.push_back(entry.value().toTensor());
  }
  return weights;
}

}  // namespace shoal
