// Reading small text files (configs, cluster specs) with errors that name
// them, and writing files whole (a reader never sees half of one).
#ifndef SHOAL_CORE_FILE_H_
#define SHOAL_CORE_FILE_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace shoal {

// The whole content of `path`; NotFound naming `what` and the path if it
// cannot be opened.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& what);

// Runs `write` on a temporary path beside `path`, then renames it to
// `path`; on any failure removes the temporary file. NotFound naming the
// folder when `path`'s folder does not exist.
absl::Status WriteFileAtomically(const std::string& path, const std::function<absl::Status(const std::string&)>& write);

// `size` bytes at `data` as the whole of `path`, atomically.
absl::Status WriteBytesAtomically(const std::string& path, const char* data, size_t size);

// `text` as the whole of `path`, atomically.
absl::Status WriteTextFile(const std::string& path, const std::string& text);

}  // namespace shoal

#endif  // SHOAL_CORE_FILE_H_
