// libFuzzer target: restoring embedding tables from a table checkpoint file
// (server/table_checkpoint.h) into a ps task's shard of a fixed Adagrad
// table and a dynamic LazyAdam one. An input whose first byte is even is the
// file's bytes as they are, so most mutations meet a checksum; an odd one
// describes chunks (table, width, optimizer, slots, push count, ids, values;
// or a dynamic table's sightings: ids, ages and counts)
// that the writer writes with right checksums, so the checks behind them
// (widths, optimizers, ids against the table, counts) are reached too.
// Either must be an error or a restore, never a crash, a hang or an
// allocation the bytes do not pay for; and a restore that fails must change
// no table (its rows, slots, row count and push count are compared before
// and after).
//
//   fuzz/run.sh builds and runs it; `--write_seeds=DIR` writes a valid table
//   checkpoint of these tables to start from.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <fuzzer/FuzzedDataProvider.h>

#include "fuzz_support.h"
#include "shoal/server/table_checkpoint.h"

namespace {

shoal::TableStore& Tables() {
  static shoal::TableStore* tables = [] {
    auto* store = new shoal::TableStore("/job:ps/task:0");
    if (!store->Create(shoal::fuzz::TwoTables()).ok()) std::abort();
    // Some rows trained, so that slots and the dynamic table hold something.
    for (const char* name : {"emb", "dyn"}) {
      shoal::EmbeddingTable* table = store->Find(name).value();
      const torch::Tensor ids = torch::arange(0, 40, 2, torch::kInt64);
      if (!table->Push(ids, torch::ones({ids.size(0), table->def().dim()})).ok()) std::abort();
    }
    return store;
  }();
  return *tables;
}

// Everything a restore may change: each table's rows, slots, row count and
// push count.
std::vector<uint64_t> Fingerprint() {
  std::vector<uint64_t> prints;
  shoal::fuzz::AddTablesFingerprint(Tables(), &prints);
  return prints;
}

// Writes the chunks `input` describes to `path`, with right checksums.
void WriteDescribedChunks(FuzzedDataProvider& input, const std::string& path) {
  auto writer = shoal::TableCheckpointWriter::Open(path);
  if (!writer.ok()) std::abort();
  const int chunks = input.ConsumeIntegralInRange(0, 4);
  for (int c = 0; c < chunks; ++c) {
    shoal::TableChunkData chunk;
    chunk.header.set_table(input.PickValueInArray({"emb", "dyn", "other", ""}));
    const int64_t dim = input.ConsumeIntegralInRange<int64_t>(0, 6);
    const int64_t count = input.ConsumeIntegralInRange<int64_t>(0, 64);
    const int slots = input.ConsumeIntegralInRange(0, 3);
    chunk.header.set_dim(dim);
    chunk.header.set_count(count);
    chunk.header.set_optimizer(input.PickValueInArray({"adagrad", "lazy_adam", "sgd", "ftrl", "adam"}));
    chunk.header.set_slots(slots);
    chunk.header.set_pushes(input.ConsumeIntegral<int64_t>());
    shoal::SavedRows& rows = chunk.rows;
    rows.ids = torch::empty({count}, torch::kInt64);
    for (int64_t i = 0; i < count; ++i) {
      rows.ids[i] = input.ConsumeBool() ? input.ConsumeIntegralInRange<int64_t>(-2, 1002) : input.ConsumeIntegral<int64_t>();
    }
    auto values = [&] {
      torch::Tensor t = torch::empty({count, dim});
      float* v = t.data_ptr<float>();
      for (int64_t i = 0; i < t.numel(); ++i) v[i] = input.ConsumeFloatingPoint<float>();
      return t;
    };
    const bool sightings = input.ConsumeBool();  // ids, ages and counts alone
    if (!sightings) rows.values = values();
    for (int k = 0; k < slots && !sightings; ++k) rows.slots.push_back(values());
    if (sightings || input.ConsumeBool()) {  // row stats, of any sign
      rows.ages = torch::empty({count}, torch::kInt64);
      rows.touches = torch::empty({count}, torch::kInt32);
      for (int64_t i = 0; i < count; ++i) {
        rows.ages[i] = input.ConsumeIntegralInRange<int64_t>(-3, 100);
        rows.touches[i] = input.ConsumeIntegralInRange<int32_t>(-1, 5);
      }
    }
    if (!(*writer)->Append(std::move(chunk)).ok()) std::abort();
  }
  if (!(*writer)->Finish().ok()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  shoal::fuzz::WriteSeedsIfAsked(*argc, *argv, [](const std::string& dir) {
    std::filesystem::create_directories(dir);
    if (!shoal::SaveTables(Tables(), dir + "/seed_tables").ok()) std::abort();
    std::ofstream(dir + "/seed_described", std::ios::binary) << std::string(1, '\1') << std::string(256, '\3');
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The reader takes a file, as a restore does; one of this process's own.
  static const std::string path = "/dev/shm/shoal_table_fuzz_" + std::to_string(getpid());
  if (size > 0 && data[0] % 2 == 1) {
    FuzzedDataProvider input(data + 1, size - 1);
    WriteDescribedChunks(input, path);
  } else {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  const std::vector<uint64_t> before = Fingerprint();
  const absl::StatusOr<int64_t> restored = shoal::RestoreTables(Tables(), {path});
  if (!restored.ok() && Fingerprint() != before) {
    std::fprintf(stderr, "a failed restore changed a table: %s\n", restored.status().ToString().c_str());
    std::abort();
  }
  return 0;
}
