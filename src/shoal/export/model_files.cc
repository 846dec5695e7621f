#include "shoal/export/model_files.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

std::string FirstLine(const std::string& what) { return what.substr(0, what.find('\n')); }

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, const std::function<absl::Status(const std::string&)>& write) {
  const std::filesystem::path target(path);
  const std::filesystem::path folder = target.has_parent_path() ? target.parent_path() : ".";
  std::error_code error;
  if (!std::filesystem::is_directory(folder, error)) {
    return absl::NotFoundError(absl::StrCat("cannot write '", path, "': its folder '", folder.string(),
                                            "' does not exist"));
  }
  const std::string temporary = absl::StrCat(path, ".tmp-", getpid());
  absl::Status status = write(temporary);
  if (status.ok()) {
    std::filesystem::rename(temporary, target, error);
    if (error) status = absl::InternalError(absl::StrCat("cannot rename '", temporary, "' to '", path, "': ", error.message()));
  }
  if (!status.ok()) std::filesystem::remove(temporary, error);
  return status;
}

namespace {

absl::Status WriteBytes(const std::string& path, const char* data, size_t size) {
  std::ofstream out(path, std::ios::binary);
  out.write(data, static_cast<std::streamsize>(size));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  return WriteFileAtomically(
      path, [&text](const std::string& temporary) { return WriteBytes(temporary, text.data(), text.size()); });
}

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
  return WriteFileAtomically(
      path, [&bytes](const std::string& temporary) { return WriteBytes(temporary, bytes.data(), bytes.size()); });
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
