#include "shoal/core/file.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace shoal {

absl::StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& what) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "' is a directory, not a file"));
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", what, " '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status WriteFileAtomically(const std::string& path, const std::function<absl::Status(const std::string&)>& write) {
  const std::filesystem::path target(path);
  const std::filesystem::path folder = target.has_parent_path() ? target.parent_path() : ".";
  std::error_code error;
  if (!std::filesystem::is_directory(folder, error)) {
    return absl::NotFoundError(absl::StrCat("cannot write '", path, "': its folder '", folder.string(),
                                            "' does not exist"));
  }
  const std::string temporary = absl::StrCat(path, ".tmp-", getpid());
  absl::Status status = write(temporary);
  if (status.ok()) {
    std::filesystem::rename(temporary, target, error);
    if (error) status = absl::InternalError(absl::StrCat("cannot rename '", temporary, "' to '", path, "': ", error.message()));
  }
  if (!status.ok()) std::filesystem::remove(temporary, error);
  return status;
}

namespace {

absl::Status WriteBytes(const std::string& path, const char* data, size_t size) {
  std::ofstream out(path, std::ios::binary);
  out.write(data, static_cast<std::streamsize>(size));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteBytesAtomically(const std::string& path, const char* data, size_t size) {
  return WriteFileAtomically(path,
                             [&](const std::string& temporary) { return WriteBytes(temporary, data, size); });
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  return WriteBytesAtomically(path, text.data(), text.size());
}

}  // namespace shoal
