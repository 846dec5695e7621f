// A fresh, empty folder under the system's temporary directory for a test,
// named after the test file's `prefix`, `name` and this process.
#ifndef SHOAL_TESTS_TEMP_DIR_H_
#define SHOAL_TESTS_TEMP_DIR_H_

#include <unistd.h>

#include <filesystem>
#include <string>

namespace shoal {

inline std::filesystem::path FreshTempDir(const std::string& prefix, const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / (prefix + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace shoal

#endif  // SHOAL_TESTS_TEMP_DIR_H_
