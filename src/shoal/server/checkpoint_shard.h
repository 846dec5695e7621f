// A checkpoint shard: the variables one task holds, with their optimizer
// slots, in one file that the task writes itself.
//
// Layout (little-endian):
//   "SHOALCKP", u32 format version, u32 record count,
//   per variable: u32 header size, u32 header CRC32C, the header
//     (wire::CheckpointRecord: name, optimizer, step, each tensor's shape,
//     dtype and CRC32C), then its tensors' bytes (float32, or int64 for an
//     integer buffer): the value, then the slots;
//   "SHOALEND", u32 record count.
// Every size is checked against the bytes left before anything is
// allocated, every header and tensor against its CRC32C, so a truncated file
// or a flipped byte is DataLoss naming the file and the variable.
//
// WriteShard is atomic: it writes `path`.tmp, fsyncs it, renames it to
// `path` and fsyncs the directory, so a reader sees the old file or the
// whole new one, never a half-written one.
#ifndef SHOAL_SERVER_CHECKPOINT_SHARD_H_
#define SHOAL_SERVER_CHECKPOINT_SHARD_H_

#include <torch/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/server/optimizer.h"

namespace shoal {

inline constexpr uint32_t kCheckpointFormatVersion = 1;

struct SavedVariable {
  std::string name;       // as its task stores it (a partition has its own)
  std::string optimizer;  // the kind the slots belong to
  torch::Tensor value;    // float32 (int64 for an integer buffer), contiguous
  OptimizerSlots slots;
};

absl::Status WriteShard(const std::string& path, const std::vector<SavedVariable>& variables);

// Where checkpoints live, by name: `dir`/ckpt-<step>/shard-<n>.ckpt. Only
// numbers enter the names, so no request can point a server outside `dir`.
inline constexpr char kCheckpointFolderPrefix[] = "ckpt-";
std::string CheckpointFolder(const std::string& dir, int64_t step);
std::string ShardFileName(int shard);

absl::StatusOr<std::vector<SavedVariable>> ReadShard(const std::string& path);
// The same from the file's bytes; `path` names it in errors (fuzzing reads
// shards from memory).
absl::StatusOr<std::vector<SavedVariable>> ParseShard(const std::string& bytes, const std::string& path);

// Writes `bytes` to `path` atomically (temp file, fsync, rename, fsync of the
// directory); checkpoint indexes use it too.
absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes);
// The last step of that for a file written elsewhere (streamed) to `temp`:
// fsync it, rename it to `path`, fsync the directory.
absl::Status CommitFile(const std::string& temp, const std::string& path);

}  // namespace shoal

#endif  // SHOAL_SERVER_CHECKPOINT_SHARD_H_
