// Comparing secrets (tokens, connection secrets) without telling a
// stranger, through the time an answer takes, how much of a guess was right.
#ifndef SHOAL_CORE_CONSTANT_TIME_H_
#define SHOAL_CORE_CONSTANT_TIME_H_

#include <algorithm>

#include "absl/strings/string_view.h"

namespace shoal {

// Equal strings, in time that depends only on their lengths.
inline bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  unsigned char differ = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0, y = i < b.size() ? b[i] : 0;
    differ |= x ^ y;
  }
  return differ == 0;
}

}  // namespace shoal

#endif  // SHOAL_CORE_CONSTANT_TIME_H_
