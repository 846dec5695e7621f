#include "source_paths.h"

namespace shoal::test_paths {

const char* SourceDir() { return SHOAL_SOURCE_DIR_PATH; }
const char* ShoalBinary() { return SHOAL_BINARY_PATH; }

}  // namespace shoal::test_paths
