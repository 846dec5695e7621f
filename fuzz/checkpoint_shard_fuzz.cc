// libFuzzer target: the checkpoint shard reader on arbitrary bytes. Every
// corruption must be an error (DATA_LOSS), never a crash, a hang or an
// allocation the bytes do not pay for.
//
//   fuzz/run.sh builds and runs it; `--write_seeds=DIR` writes a valid shard
//   to start from.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "fuzz_support.h"
#include "shoal/server/checkpoint_shard.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  shoal::fuzz::WriteSeedsIfAsked(*argc, *argv, [](const std::string& dir) {
    std::filesystem::create_directories(dir);
    shoal::SavedVariable kernel{"dense_1/kernel", "adam", torch::ones({3, 2}), {{torch::zeros({3, 2}), torch::ones({3, 2})}, 7}};
    shoal::SavedVariable bias{"dense_1/bias", "sgd", torch::arange(2, torch::kFloat32), {}};
    (void)shoal::WriteShard(dir + "/seed_shard", {kernel, bias});
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  (void)shoal::ParseShard(bytes, "fuzz input");
  return 0;
}
