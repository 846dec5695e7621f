#include "shoal/core/dtype.h"

namespace shoal {

std::optional<wire::DType> WireDType(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat32:
      return wire::DTYPE_FLOAT32;
    case torch::kInt64:
      return wire::DTYPE_INT64;
    default:
      return std::nullopt;
  }
}

std::optional<torch::ScalarType> TorchDType(wire::DType dtype) {
  switch (static_cast<int>(dtype)) {
    case wire::DTYPE_INVALID:
    case wire::DTYPE_FLOAT32:
      return torch::kFloat32;
    case wire::DTYPE_INT64:
      return torch::kInt64;
    default:
      return std::nullopt;
  }
}

std::string DTypeName(torch::ScalarType type) {
  if (type == torch::kFloat32) return "float32";
  if (type == torch::kInt64) return "int64";
  return c10::toString(type);
}

}  // namespace shoal
