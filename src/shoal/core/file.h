// Reading small text files (configs, cluster specs) with errors that name them.
#ifndef SHOAL_CORE_FILE_H_
#define SHOAL_CORE_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace shoal {

// The whole content of `path`; NotFound naming `what` and the path if it
// cannot be opened.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& what);

}  // namespace shoal

#endif  // SHOAL_CORE_FILE_H_
