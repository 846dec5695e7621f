// What the training benchmarks share: their two flags and the median they
// report (runs alternate between the two sides of a ratio; the median keeps
// one noisy run from moving it).
#ifndef SHOAL_BENCH_BENCH_RUN_H_
#define SHOAL_BENCH_BENCH_RUN_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"

namespace shoal {

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct RunFlags {
  int64_t steps = 0;    // --steps N: timed steps per run
  int64_t repeats = 0;  // --repeats R: runs of each side
};

// `defaults` with --steps and --repeats from the command line.
inline RunFlags ParseRunFlags(int argc, char** argv, RunFlags defaults) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps") (void)absl::SimpleAtoi(argv[i + 1], &defaults.steps);
    if (flag == "--repeats") (void)absl::SimpleAtoi(argv[i + 1], &defaults.repeats);
  }
  return defaults;
}

}  // namespace shoal

#endif  // SHOAL_BENCH_BENCH_RUN_H_
