#include "shoal/core/nearest_word.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shoal {
namespace {

// Damerau-Levenshtein (optimal string alignment) distance.
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t replace = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + replace});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::string NearestWord(const std::string& word, const std::set<std::string>& known) {
  const size_t close_enough = std::max<size_t>(2, word.size() / 3);
  std::string nearest;
  size_t best = close_enough + 1;
  for (const std::string& candidate : known) {
    const size_t distance = EditDistance(word, candidate);
    if (distance < best) {
      best = distance;
      nearest = candidate;
    }
  }
  return nearest;
}

std::string DidYouMean(const std::string& word, const std::set<std::string>& known, const std::string& prefix) {
  const std::string nearest = NearestWord(word, known);
  return nearest.empty() ? "" : absl::StrCat(" (did you mean ", prefix, nearest, "?)");
}

}  // namespace shoal
