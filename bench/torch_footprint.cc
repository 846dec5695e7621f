// What loading libtorch alone keeps resident: a process that links only
// libtorch, makes one tensor, and prints its resident memory as JSON
// ({"rss_bytes": ..., "anon_bytes": ..., "file_bytes": ...}). Every ps task
// pays this before it holds a single row; bench/click.sh sets a ps task's
// peak resident memory against it.
//
//   build/bench/torch_footprint
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

int main() {
  torch::Tensor one = torch::ones({4});
  std::map<std::string, long> kib;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    std::istringstream fields(line);
    std::string key;
    long value = 0;
    if (fields >> key >> value) kib[key] = value;
  }
  std::printf("{\"rss_bytes\": %ld, \"anon_bytes\": %ld, \"file_bytes\": %ld}\n", kib["VmRSS:"] * 1024,
              kib["RssAnon:"] * 1024, kib["RssFile:"] * 1024);
  return one.sum().item<float>() == 4 ? 0 : 1;
}
