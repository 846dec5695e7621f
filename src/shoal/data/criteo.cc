#include "shoal/data/criteo.h"

#include <algorithm>
#include <fstream>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace shoal {
namespace {

constexpr int kColumns = kCriteoIntegerFeatures + kCriteoCategoricalFeatures;
constexpr int kFields = 1 + kColumns;

uint64_t Fold(uint64_t id, int64_t buckets) {
  // SplitMix64's finaliser spreads (feature, hash) before the modulo.
  id ^= id >> 30;
  id *= 0xbf58476d1ce4e5b9ULL;
  id ^= id >> 27;
  id *= 0x94d049bb133111ebULL;
  id ^= id >> 31;
  return id % static_cast<uint64_t>(buckets);
}

}  // namespace

absl::StatusOr<ClickLog> ReadCriteo(const std::string& path, const CriteoOptions& options) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open the click log '", path, "'"));
  if (options.buckets < 0 || options.max_examples < 0) {
    return absl::InvalidArgumentError("buckets and max_examples must be >= 0");
  }
  // Counted first, so that the examples are parsed into their final buffer
  // (a log of 10M examples is 3.1 GB as int64; no second copy).
  int64_t lines = 0;
  {
    std::ifstream counting(path, std::ios::binary);
    std::vector<char> buffer(1 << 20);
    while (counting.read(buffer.data(), static_cast<std::streamsize>(buffer.size())) || counting.gcount() > 0) {
      lines += std::count(buffer.data(), buffer.data() + counting.gcount(), '\n');
    }
    ++lines;  // a last line without a newline
  }
  if (options.max_examples > 0) lines = std::min(lines, options.max_examples);
  std::vector<float> labels;
  labels.reserve(static_cast<size_t>(lines));
  auto examples = std::make_unique<std::vector<int64_t>>();
  examples->reserve(static_cast<size_t>(lines) * kColumns);
  std::string line;
  int64_t line_number = 0;
  while ((options.max_examples == 0 || static_cast<int64_t>(labels.size()) < options.max_examples) &&
         std::getline(in, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::vector<absl::string_view> fields = absl::StrSplit(line, '\t');
    const std::string where = absl::StrCat(path, ":", line_number);
    if (fields.size() != kFields) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", fields.size(), " tab-separated fields, expected ",
                                                     kFields, " (label, 13 integers, 26 categorical hashes)"));
    }
    if (fields[0] != "0" && fields[0] != "1") {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the label is '", fields[0], "', not 0 or 1"));
    }
    labels.push_back(fields[0] == "1" ? 1.0f : 0.0f);
    for (int f = 0; f < kCriteoIntegerFeatures; ++f) {
      const absl::string_view field = fields[1 + f];
      int64_t value = 0;
      if (!field.empty() && !absl::SimpleAtoi(field, &value)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": integer feature ", f + 1, " is '", field, "', not an integer"));
      }
      examples->push_back(value);
    }
    for (int f = 0; f < kCriteoCategoricalFeatures; ++f) {
      const absl::string_view field = fields[1 + kCriteoIntegerFeatures + f];
      uint64_t hash = 0;
      if (!field.empty() && (field.size() > 8 || !absl::SimpleHexAtoi(field, &hash))) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": categorical feature ", f + 1, " is '", field,
                                                       "', not a 32-bit hex hash"));
      }
      const uint64_t id = (static_cast<uint64_t>(f) << 32) | hash;
      examples->push_back(static_cast<int64_t>(options.buckets > 0 ? Fold(id, options.buckets) : id));
    }
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("reading the click log '", path, "' failed"));
  const int64_t n = static_cast<int64_t>(labels.size());
  ClickLog log;
  log.labels = torch::from_blob(labels.data(), {n}, torch::kFloat32).clone();
  std::vector<int64_t>* owned = examples.release();
  log.examples = torch::from_blob(
      owned->data(), {n, kColumns}, [owned](void*) { delete owned; }, torch::kInt64);
  log.integers = log.examples.narrow(1, 0, kCriteoIntegerFeatures);
  log.categorical = log.examples.narrow(1, kCriteoIntegerFeatures, kCriteoCategoricalFeatures);
  return log;
}

}  // namespace shoal
