// The tensor dtypes shoal carries on the wire, in its stores and in its
// checkpoints: float32 (parameters, gradients, slots, float buffers) and
// int64 (integer buffers such as BatchNorm's num_batches_tracked).
#ifndef SHOAL_CORE_DTYPE_H_
#define SHOAL_CORE_DTYPE_H_

#include <torch/types.h>

#include <optional>
#include <string>

#include "shoal/wire.pb.h"

namespace shoal {

// The wire dtype of a torch scalar type, or nullopt for one shoal does not carry.
std::optional<wire::DType> WireDType(torch::ScalarType type);
// The torch type of a wire dtype; DTYPE_INVALID (unset, as in files and
// definitions older than int64 support) reads as float32. nullopt for a
// number that is no known dtype.
std::optional<torch::ScalarType> TorchDType(wire::DType dtype);
// numpy's name for a torch scalar type ("float32", "int64", "float64", ...).
std::string DTypeName(torch::ScalarType type);

}  // namespace shoal

#endif  // SHOAL_CORE_DTYPE_H_
