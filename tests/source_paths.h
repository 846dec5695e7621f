// Where the tests find the source tree and the shoal binary. The paths are
// compiled into source_paths.cc alone, so that every other test file
// compiles to the same command in any clone, and ccache serves it to a
// clone made in another folder.
#ifndef SHOAL_TESTS_SOURCE_PATHS_H_
#define SHOAL_TESTS_SOURCE_PATHS_H_

namespace shoal::test_paths {
const char* SourceDir();    // the repository root
const char* ShoalBinary();  // build/shoal
}  // namespace shoal::test_paths

#define SHOAL_SOURCE_DIR (::shoal::test_paths::SourceDir())
#define SHOAL_BINARY (::shoal::test_paths::ShoalBinary())

#endif  // SHOAL_TESTS_SOURCE_PATHS_H_
