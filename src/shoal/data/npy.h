// NPY files (numpy.save's format, versions 1.0 to 3.0): what any dataset
// exported from numpy arrives as.
//
// ReadNpy trusts nothing: a bad magic number, an unknown version, a header
// that does not parse, a dtype shoal does not read, a Fortran-order array, a
// shape whose size overflows, or a file shorter or longer than the shape
// says is an error naming the file and what is wrong, found before the data
// is allocated.
#ifndef SHOAL_DATA_NPY_H_
#define SHOAL_DATA_NPY_H_

#include <torch/types.h>

#include <string>

#include "absl/status/statusor.h"

namespace shoal {

// The array in `path`, with its shape, as float32 ('<f4'), uint8 ('|u1')
// or int64 ('<i8') as the file says: the dtypes features, class labels and
// regression targets come in.
absl::StatusOr<torch::Tensor> ReadNpy(const std::string& path);

// Writes `tensor` (float32, uint8 or int64, contiguous or not) as a version
// 1.0 NPY file: for tests and for exporting shoal's data.
absl::Status WriteNpy(const std::string& path, const torch::Tensor& tensor);

}  // namespace shoal

#endif  // SHOAL_DATA_NPY_H_
