// Status helpers shared by every layer. shoal reports errors as absl::Status
// (no exceptions cross a layer boundary); these helpers add context as an
// error travels up, and turn libtorch's exceptions into a Status at the few
// places where torch is called on data that came from outside.
#ifndef SHOAL_CORE_STATUS_H_
#define SHOAL_CORE_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace shoal {

// Returns `status` with "context: " put in front of its message; OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

// Runs `fn` (which may throw c10::Error or std::exception) and returns its
// failure as an InvalidArgument naming `what`.
template <typename Fn>
absl::Status CatchTorch(absl::string_view what, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    std::string message = e.what();
    // c10::Error messages carry a backtrace after the first line.
    if (auto nl = message.find('\n'); nl != std::string::npos) message.resize(nl);
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", message));
  }
}

}  // namespace shoal

#define SHOAL_RETURN_IF_ERROR(expr)            \
  do {                                         \
    absl::Status shoal_status_ = (expr);       \
    if (!shoal_status_.ok()) return shoal_status_; \
  } while (0)

#define SHOAL_CONCAT_INNER(a, b) a##b
#define SHOAL_CONCAT(a, b) SHOAL_CONCAT_INNER(a, b)
#define SHOAL_ASSIGN_OR_RETURN(lhs, expr) \
  SHOAL_ASSIGN_OR_RETURN_IMPL(SHOAL_CONCAT(shoal_statusor_, __LINE__), lhs, expr)
#define SHOAL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

#endif  // SHOAL_CORE_STATUS_H_
