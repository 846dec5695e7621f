#include "shoal/model/script_builder.h"

#include <atomic>
#include <cctype>

#include "absl/strings/str_cat.h"

namespace shoal {
namespace {

// Each built module gets a class of its own: two MLPs of other sizes are
// other classes, and a saved file must not hold two classes of one name.
std::string UniqueClassName(const std::string& kind) {
  static std::atomic<int64_t> next{0};
  return absl::StrCat("__torch__.shoal.", kind, "_", next.fetch_add(1));
}

std::string AttributeName(const std::string& variable) {
  std::string name = variable;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') c = '_';
  }
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) name = "v_" + name;
  return name;
}

}  // namespace

ScriptBuilder::ScriptBuilder(const std::string& kind)
    : module_(c10::QualifiedName(UniqueClassName(kind))), kind_(kind) {}

std::string ScriptBuilder::AddTensor(const std::string& variable, const torch::Tensor& value, bool is_buffer) {
  const std::string name = AttributeName(variable);
  torch::Tensor copy = value.detach().clone();
  if (!is_buffer) copy.requires_grad_(true);
  module_.register_parameter(name, copy, is_buffer);
  return name;
}

std::string ScriptBuilder::AddParameter(const std::string& variable, const torch::Tensor& value) {
  return AddTensor(variable, value, /*is_buffer=*/false);
}

std::string ScriptBuilder::AddBuffer(const std::string& variable, const torch::Tensor& value) {
  return AddTensor(variable, value, /*is_buffer=*/true);
}

void ScriptBuilder::AddModule(const std::string& name, const torch::jit::Module& module) {
  module_.register_module(name, module);
}

absl::StatusOr<torch::jit::Module> ScriptBuilder::Finish(const std::string& source) {
  try {
    module_.define(source);
  } catch (const std::exception& e) {
    // The compiler's message opens with a blank line; its first paragraph
    // says what is wrong and quotes the line.
    std::string message = e.what();
    message.erase(0, message.find_first_not_of(" \n"));
    message = message.substr(0, message.find("\n\n"));
    return absl::InvalidArgumentError(absl::StrCat("the ", kind_, " model's TorchScript does not compile: ", message));
  }
  module_.eval();
  return module_;
}

}  // namespace shoal
