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
  switch (type) {
    case torch::kFloat32:
      return "float32";
    case torch::kInt64:
      return "int64";
    case torch::kFloat64:
      return "float64";
    case torch::kFloat16:
      return "float16";
    case torch::kBFloat16:
      return "bfloat16";
    case torch::kInt32:
      return "int32";
    case torch::kInt16:
      return "int16";
    case torch::kInt8:
      return "int8";
    case torch::kUInt8:
      return "uint8";
    case torch::kBool:
      return "bool";
    default:
      return c10::toString(type);
  }
}

}  // namespace shoal
