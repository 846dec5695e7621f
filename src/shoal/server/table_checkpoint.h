// Table checkpoint files: a ps task's shards of its embedding tables, which
// it streams a chunk of rows at a time into ckpt-<step>/tables-<n>.ckpt
// beside its variables' shard (server/checkpoint_shard.h), so that no
// process ever copies a whole table. SaveTables and RestoreTables move a
// task's tables to and from such files.
//
// Layout (little-endian):
//   "SHOALTBL", u32 format version,
//   per chunk: u32 header size, u32 header CRC32C, the header
//     (wire::TableChunk: table, dim, count, optimizer, slots, pushes,
//     row_stats, sightings, and the CRC32C of each tensor), then the ids
//     (int64 [count]), the rows (float32 [count, dim]), each slot (float32
//     [count, dim]) and, with row_stats (dynamic tables, format 2), the
//     rows' ages (int64 [count]) and touch counts (int32 [count]); a chunk
//     of sightings (format 3: ids seen fewer than min_count times) has no
//     rows or slots, only the ids, ages and counts;
//   "SHOALEND", u64 chunk count.
// The reader checks every size against the bytes left before it allocates,
// every header and tensor against its CRC32C, and the end tag and count, so
// a truncated file or a flipped byte is DataLoss naming the file and the
// chunk. The writer writes `path`.tmp and renames it when done (atomic).
//
// Not thread-safe: one writer or reader per file.
#ifndef SHOAL_SERVER_TABLE_CHECKPOINT_H_
#define SHOAL_SERVER_TABLE_CHECKPOINT_H_

#include <torch/types.h>

#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/server/embedding_table.h"
#include "shoal/wire.pb.h"

namespace shoal {

// tables-<shard>.ckpt: numbers only, as the shard files' names.
std::string TableFileName(int shard);

// One chunk as written and read.
struct TableChunkData {
  wire::TableChunk header;  // table, dim, count, optimizer, slots, pushes, row_stats
  SavedRows rows;
};

class TableCheckpointWriter {
 public:
  // Creates `path`.tmp.
  static absl::StatusOr<std::unique_ptr<TableCheckpointWriter>> Open(const std::string& path);
  ~TableCheckpointWriter();
  // Appends a chunk (header's crc32c filled in here).
  absl::Status Append(TableChunkData chunk);
  // Ends the file and renames it into place.
  absl::Status Finish();

 private:
  TableCheckpointWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  absl::Status Write(const void* data, size_t size);

  std::string path_;
  std::FILE* file_;
  uint64_t chunks_ = 0;
};

// Reads `path` chunk by chunk, handing each to `visit` (which may stop the
// read with an error); at most one chunk is in memory at a time.
absl::Status ReadTableCheckpoint(const std::string& path,
                                 const std::function<absl::Status(const TableChunkData&)>& visit);

// Streams every table `tables` holds to `path`, a chunk at a time, while
// pushes go on (EmbeddingTable::ForEachChunk); false, and no file, when it
// holds none. Saves and restores of `tables` run one at a time.
absl::StatusOr<bool> SaveTables(const TableStore& tables, const std::string& path);

// Restores `tables` from table checkpoint `files`: each file is read twice,
// first to check all of it (checksums, every chunk's table known here, its
// width, optimizer and ids, and that each dynamic table has room under its
// bound for the rows it would make), then to set the rows that map to this
// task, so a corrupt, mismatched or too large checkpoint changes no table.
// Each table the files hold goes back to them: rows it made since are
// dropped. With `only`, just the ids it lists (sorted) of the tables it
// names are added to what the tables hold. Returns the rows set.
absl::StatusOr<int64_t> RestoreTables(const TableStore& tables, const std::vector<std::string>& files,
                                      const std::map<std::string, std::vector<int64_t>>* only = nullptr);

}  // namespace shoal

#endif  // SHOAL_SERVER_TABLE_CHECKPOINT_H_
