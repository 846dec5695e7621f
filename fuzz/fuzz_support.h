// What the libFuzzer targets share: the seeds flag, the tables a ps task
// holds in them, and a fingerprint of everything its tables hold, to check
// that a refused input changed none of it.
#ifndef SHOAL_FUZZ_FUZZ_SUPPORT_H_
#define SHOAL_FUZZ_FUZZ_SUPPORT_H_

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "shoal/core/crc32c.h"
#include "shoal/server/embedding_table.h"

namespace shoal::fuzz {

// With `--write_seeds=DIR` among the arguments, `write(DIR)` writes the
// target's seeds and the process ends; otherwise nothing happens.
inline void WriteSeedsIfAsked(int argc, char** argv, const std::function<void(const std::string&)>& write) {
  const std::string flag = "--write_seeds=";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind(flag, 0) == 0) {
      write(arg.substr(flag.size()));
      std::exit(0);
    }
  }
}

// Shard 0 of 2 of a fixed Adagrad table "emb" (1000 x 4), and a dynamic
// LazyAdam one "dyn" (x 2, admitting on a second sighting, at most 8 rows,
// evicting when full).
inline std::vector<wire::TableDef> TwoTables() {
  wire::TableDef fixed;
  fixed.set_name("emb");
  fixed.set_rows(1000);
  fixed.set_dim(4);
  fixed.set_num_shards(2);
  fixed.set_shard(0);
  fixed.set_seed(1);
  fixed.set_init_scale(0.05);
  fixed.mutable_optimizer()->set_kind("adagrad");
  wire::TableDef dynamic = fixed;
  dynamic.set_name("dyn");
  dynamic.set_rows(0);
  dynamic.set_dim(2);
  dynamic.mutable_optimizer()->set_kind("lazy_adam");
  // Small enough that pushes soon fill it: admission after two sightings,
  // then eviction of what was touched longest ago.
  dynamic.set_min_count(2);
  dynamic.set_max_rows(8);
  dynamic.set_evict_when_full(true);
  return {fixed, dynamic};
}

// A CRC32C over each table's ids, rows, slots and sightings, then its row
// and push counts, appended to `prints`.
inline void AddTablesFingerprint(const TableStore& tables, std::vector<uint64_t>* prints) {
  for (const EmbeddingTable* table : tables.All()) {
    uint32_t crc = 0;
    auto add = [&](const torch::Tensor& t) { crc = Crc32c(t.data_ptr(), t.nbytes(), crc); };
    const absl::Status walked = table->ForEachChunk(256, [&](const SavedRows& rows, int64_t) {
      add(rows.ids);
      if (!rows.sightings()) add(rows.values);
      for (const torch::Tensor& slot : rows.slots) add(slot);
      if (rows.ages.defined()) {
        add(rows.ages);
        add(rows.touches);
      }
      return absl::OkStatus();
    });
    if (!walked.ok()) std::abort();
    prints->push_back(crc);
    prints->push_back(static_cast<uint64_t>(table->size()));
    prints->push_back(static_cast<uint64_t>(table->pushes()));
  }
}

}  // namespace shoal::fuzz

#endif  // SHOAL_FUZZ_FUZZ_SUPPORT_H_
