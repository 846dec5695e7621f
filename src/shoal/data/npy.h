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

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shoal {

// The array in `path`, with its shape, as float32 ('<f4'), uint8 ('|u1')
// or int64 ('<i8') as the file says: the dtypes features, class labels and
// regression targets come in.
absl::StatusOr<torch::Tensor> ReadNpy(const std::string& path);

// Writes `tensor` (float32, uint8 or int64, contiguous or not) as a version
// 1.0 NPY file: for tests and for exporting shoal's data.
absl::Status WriteNpy(const std::string& path, const torch::Tensor& tensor);

// Writes an NPY file a block of rows at a time, for arrays larger than
// memory (a table's rows): the header's row count is filled in by Finish.
class NpyAppender {
 public:
  // `dtype` as WriteNpy takes; each row is `row_shape` (empty: one value).
  static absl::StatusOr<std::unique_ptr<NpyAppender>> Open(const std::string& path, torch::ScalarType dtype,
                                                           std::vector<int64_t> row_shape);
  // Rows [k, *row_shape] of the dtype.
  absl::Status Append(const torch::Tensor& rows);
  absl::Status Finish();
  int64_t rows() const { return rows_; }

 private:
  NpyAppender(std::string path, torch::ScalarType dtype, std::string descr, std::vector<int64_t> row_shape)
      : path_(std::move(path)), dtype_(dtype), descr_(std::move(descr)), row_shape_(std::move(row_shape)) {}
  std::string Header() const;

  std::string path_;
  torch::ScalarType dtype_;
  std::string descr_;
  std::vector<int64_t> row_shape_;
  std::ofstream out_;
  size_t header_bytes_ = 0;
  int64_t rows_ = 0;
};

}  // namespace shoal

#endif  // SHOAL_DATA_NPY_H_
