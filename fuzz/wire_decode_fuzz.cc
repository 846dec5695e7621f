// libFuzzer target: the wire codec's decoder on arbitrary bytes, as one chunk
// and split in two (gRPC hands over several slices). Decoding must return
// an error or a message, never crash, hang or read out of bounds.
//
//   fuzz/run.sh builds and runs it; `--write_seeds=DIR` writes valid
//   encodings to start from.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz_support.h"
#include "shoal/core/codec.h"

namespace {

void WriteSeeds(const std::string& dir) {
  std::filesystem::create_directories(dir);
  shoal::Request apply;
  apply.header.mutable_apply_gradients()->add_names("dense_1/kernel");
  apply.tensors.push_back(torch::ones({3, 2}));
  shoal::Request read;
  read.header.mutable_read()->add_names("dense_1/bias");
  shoal::Response response;
  response.header.mutable_read();
  response.tensors.push_back(torch::arange(5, torch::kFloat32));
  int n = 0;
  for (const auto& encoded : {shoal::EncodeRequest(apply), shoal::EncodeRequest(read), shoal::EncodeResponse(response)}) {
    std::ofstream(dir + "/seed_" + std::to_string(n++), std::ios::binary) << encoded->Flatten();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  shoal::fuzz::WriteSeedsIfAsked(*argc, *argv, WriteSeeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  const size_t max_bytes = 1 << 20;
  shoal::Request request;
  (void)shoal::DecodeRequest({bytes}, max_bytes, &request);
  shoal::Response response;
  (void)shoal::DecodeResponse({bytes}, max_bytes, &response);
  const size_t half = size / 2;
  const absl::string_view chunks[] = {bytes.substr(0, half), bytes.substr(half)};
  shoal::Request split;
  (void)shoal::DecodeRequest(chunks, max_bytes, &split);
  return 0;
}
