// Click logs in the Criteo format (the Display Advertising Challenge's and
// Criteo 1TB's): one example per line, tab-separated, a 0/1 label, 13
// integer features and 26 categorical features given as 32-bit hex hashes.
// Any feature may be empty (missing).
//
// Integers are kept as they are (missing: 0); the click model takes
// log(1 + max(x, 0)) of them (DLRM's transform).
// Categorical feature f with hash h becomes the id (f << 32) | h, so the 26
// features share one id space without colliding (a dynamic table holds
// them as they are); missing is h = 0. With `buckets` > 0 ids are folded to
// [0, buckets) instead, for a fixed table.
//
// A line with the wrong number of fields, a label other than 0 or 1, an
// integer or hash that does not parse, is an error naming the file and the
// line; nothing is returned.
#ifndef SHOAL_DATA_CRITEO_H_
#define SHOAL_DATA_CRITEO_H_

#include <torch/types.h>

#include <string>

#include "absl/status/statusor.h"

namespace shoal {

inline constexpr int kCriteoIntegerFeatures = 13;
inline constexpr int kCriteoCategoricalFeatures = 26;

struct ClickLog {
  torch::Tensor labels;       // [n] float32, 0 or 1
  torch::Tensor examples;     // [n, 13 + 26] int64: the integers, then the ids (what the click model reads)
  torch::Tensor integers;     // [n, 13], a view of examples
  torch::Tensor categorical;  // [n, 26] ids, a view of examples
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

struct CriteoOptions {
  int64_t max_examples = 0;  // 0: the whole file
  int64_t buckets = 0;       // 0: ids (feature << 32) | hash; else folded to [0, buckets)
};

absl::StatusOr<ClickLog> ReadCriteo(const std::string& path, const CriteoOptions& options = {});

}  // namespace shoal

#endif  // SHOAL_DATA_CRITEO_H_
