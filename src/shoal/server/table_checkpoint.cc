#include "shoal/server/table_checkpoint.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "shoal/core/crc32c.h"
#include "shoal/core/status.h"
#include "shoal/server/checkpoint_shard.h"

namespace shoal {
namespace {

constexpr char kMagic[] = "SHOALTBL";
constexpr char kEnd[] = "SHOALEND";
constexpr size_t kTagSize = 8;
// 2: dynamic tables' chunks may carry their rows' ages and touch counts;
// 3: and a min_count table's sightings, in chunks of their own. Files of
// formats 1 and 2 are read too (rows without stats; no sightings).
constexpr uint32_t kTableFormatVersion = 3;
constexpr uint32_t kMaxHeaderBytes = 1 << 20;
constexpr int kMaxSlots = 2;  // lazy_adam and ftrl keep two

void PutLittleEndian(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetLittleEndian(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

// Reads a table file in order; every read is checked against what is left.
class FileReader {
 public:
  FileReader(std::ifstream& in, uint64_t size, const std::string& path) : in_(in), left_(size), path_(path) {}
  absl::Status Read(void* out, uint64_t n, const std::string& what) {
    if (n > left_) {
      return absl::DataLossError(absl::StrCat("table checkpoint '", path_, "' is truncated: ", what, " needs ", n,
                                              " bytes, ", left_, " are left"));
    }
    in_.read(static_cast<char*>(out), static_cast<std::streamsize>(n));
    if (!in_) return absl::DataLossError(absl::StrCat("reading table checkpoint '", path_, "' failed at ", what));
    left_ -= n;
    return absl::OkStatus();
  }
  uint64_t left() const { return left_; }

 private:
  std::ifstream& in_;
  uint64_t left_;
  const std::string& path_;
};

}  // namespace

std::string TableFileName(int shard) { return absl::StrCat("tables-", shard, ".ckpt"); }

absl::StatusOr<std::unique_ptr<TableCheckpointWriter>> TableCheckpointWriter::Open(const std::string& path) {
  std::FILE* file = std::fopen((path + ".tmp").c_str(), "wb");
  if (file == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create '", path, ".tmp': ", std::strerror(errno)));
  }
  std::unique_ptr<TableCheckpointWriter> writer(new TableCheckpointWriter(path, file));
  std::string head(kMagic, kTagSize);
  PutLittleEndian(&head, kTableFormatVersion, 4);
  SHOAL_RETURN_IF_ERROR(writer->Write(head.data(), head.size()));
  return writer;
}

TableCheckpointWriter::~TableCheckpointWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove((path_ + ".tmp").c_str());  // not finished: leave nothing behind
  }
}

absl::Status TableCheckpointWriter::Write(const void* data, size_t size) {
  if (size > 0 && std::fwrite(data, 1, size, file_) != size) {
    return absl::InternalError(absl::StrCat("cannot write '", path_, ".tmp': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status TableCheckpointWriter::Append(TableChunkData chunk) {
  const SavedRows& rows = chunk.rows;
  std::vector<torch::Tensor> tensors = {rows.ids.contiguous()};
  if (!rows.sightings()) tensors.push_back(rows.values.contiguous());
  for (const torch::Tensor& slot : rows.slots) tensors.push_back(slot.contiguous());
  chunk.header.set_sightings(rows.sightings());
  chunk.header.set_row_stats(rows.ages.defined());
  if (rows.ages.defined()) {
    tensors.push_back(rows.ages.contiguous());
    tensors.push_back(rows.touches.contiguous());
  }
  chunk.header.set_count(rows.ids.numel());
  chunk.header.set_slots(static_cast<int32_t>(rows.slots.size()));
  chunk.header.clear_crc32c();
  for (const torch::Tensor& t : tensors) chunk.header.add_crc32c(Crc32c(t.data_ptr(), t.nbytes()));
  const std::string header = chunk.header.SerializeAsString();
  std::string prefix;
  PutLittleEndian(&prefix, header.size(), 4);
  PutLittleEndian(&prefix, Crc32c(header.data(), header.size()), 4);
  SHOAL_RETURN_IF_ERROR(Write(prefix.data(), prefix.size()));
  SHOAL_RETURN_IF_ERROR(Write(header.data(), header.size()));
  for (const torch::Tensor& t : tensors) SHOAL_RETURN_IF_ERROR(Write(t.data_ptr(), t.nbytes()));
  ++chunks_;
  return absl::OkStatus();
}

absl::Status TableCheckpointWriter::Finish() {
  std::string tail(kEnd, kTagSize);
  PutLittleEndian(&tail, chunks_, 8);
  SHOAL_RETURN_IF_ERROR(Write(tail.data(), tail.size()));
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!closed) return absl::InternalError(absl::StrCat("cannot close '", path_, ".tmp'"));
  return CommitFile(path_ + ".tmp", path_);
}

absl::Status ReadTableCheckpoint(const std::string& path,
                                 const std::function<absl::Status(const TableChunkData&)>& visit) {
  std::error_code error;
  const uint64_t size = std::filesystem::file_size(path, error);
  std::ifstream in(path, std::ios::binary);
  if (error || !in) return absl::NotFoundError(absl::StrCat("table checkpoint '", path, "' cannot be opened"));
  FileReader reader(in, size, path);
  char tag[kTagSize + 4];
  SHOAL_RETURN_IF_ERROR(reader.Read(tag, kTagSize + 4, "the magic number"));
  if (std::memcmp(tag, kMagic, kTagSize) != 0) {
    return absl::DataLossError(absl::StrCat("'", path, "' is not a shoal table checkpoint (bad magic number)"));
  }
  const uint32_t version = static_cast<uint32_t>(GetLittleEndian(tag + kTagSize, 4));
  if (version < 1 || version > kTableFormatVersion) {
    return absl::DataLossError(absl::StrCat("table checkpoint '", path, "' has format version ", version,
                                            "; this build reads 1 to ", kTableFormatVersion));
  }
  for (uint64_t chunk = 0;; ++chunk) {
    const std::string where = absl::StrCat("table checkpoint '", path, "', chunk ", chunk);
    char prefix[kTagSize];
    SHOAL_RETURN_IF_ERROR(reader.Read(prefix, kTagSize, absl::StrCat("chunk ", chunk, "'s header size")));
    if (std::memcmp(prefix, kEnd, kTagSize) == 0) {  // a header is never 1 GiB: "SHOA" cannot start one
      char count[8];
      SHOAL_RETURN_IF_ERROR(reader.Read(count, 8, "the chunk count"));
      if (GetLittleEndian(count, 8) != chunk || reader.left() != 0) {
        return absl::DataLossError(absl::StrCat("table checkpoint '", path, "' ends wrong: it says ",
                                                GetLittleEndian(count, 8), " chunks, ", chunk, " were read, ",
                                                reader.left(), " bytes follow"));
      }
      return absl::OkStatus();
    }
    const uint32_t header_size = static_cast<uint32_t>(GetLittleEndian(prefix, 4));
    if (header_size > kMaxHeaderBytes) {
      return absl::DataLossError(absl::StrCat(where, ": a header of ", header_size, " bytes"));
    }
    std::string header(header_size, '\0');
    SHOAL_RETURN_IF_ERROR(reader.Read(header.data(), header_size, "a chunk header"));
    TableChunkData data;
    if (Crc32c(header.data(), header.size()) != GetLittleEndian(prefix + 4, 4) ||
        !data.header.ParseFromString(header)) {
      return absl::DataLossError(absl::StrCat(where, ": the header is corrupt (checksum)"));
    }
    const wire::TableChunk& h = data.header;
    const int64_t count = h.count(), dim = h.dim();
    const int stats = h.row_stats() ? 2 : 0;
    // Sightings: ids and their stats alone.
    const bool sightings = h.sightings();
    const int row_tensors = sightings ? 0 : 1 + h.slots();
    if (sightings && (stats == 0 || h.slots() != 0)) {
      return absl::DataLossError(
          absl::StrCat(where, " (table '", h.table(), "'): sightings without their ages and counts, or with slots"));
    }
    if (count < 0 || dim <= 0 || h.slots() < 0 || h.slots() > kMaxSlots ||
        h.crc32c_size() != 1 + row_tensors + stats ||
        dim > std::numeric_limits<int32_t>::max() || count > static_cast<int64_t>(reader.left() / 8)) {
      return absl::DataLossError(absl::StrCat(where, " (table '", h.table(), "'): a header that cannot be right (",
                                              count, " rows of ", dim, ", ", h.slots(), " slots)"));
    }
    // Every byte the chunk claims must be in the file before any is allocated.
    const uint64_t row_bytes = static_cast<uint64_t>(count) * static_cast<uint64_t>(dim) * 4;
    if (row_bytes / 4 / static_cast<uint64_t>(dim) != static_cast<uint64_t>(count) ||
        static_cast<uint64_t>(count) * (8 + (stats ? 12 : 0)) + row_bytes * row_tensors > reader.left()) {
      return absl::DataLossError(absl::StrCat(where, " (table '", h.table(), "') is truncated"));
    }
    SavedRows& rows = data.rows;
    rows.ids = torch::empty({count}, torch::kInt64);
    std::vector<torch::Tensor*> tensors = {&rows.ids};
    if (!sightings) {
      rows.values = torch::empty({count, dim}, torch::kFloat32);
      tensors.push_back(&rows.values);
    }
    for (int s = 0; s < h.slots(); ++s) rows.slots.push_back(torch::empty({count, dim}, torch::kFloat32));
    for (torch::Tensor& slot : rows.slots) tensors.push_back(&slot);
    if (stats) {
      rows.ages = torch::empty({count}, torch::kInt64);
      rows.touches = torch::empty({count}, torch::kInt32);
      tensors.push_back(&rows.ages);
      tensors.push_back(&rows.touches);
    }
    for (size_t t = 0; t < tensors.size(); ++t) {
      torch::Tensor& tensor = *tensors[t];
      SHOAL_RETURN_IF_ERROR(reader.Read(tensor.data_ptr(), tensor.nbytes(), absl::StrCat(where, "'s tensors")));
      if (Crc32c(tensor.data_ptr(), tensor.nbytes()) != h.crc32c(static_cast<int>(t))) {
        return absl::DataLossError(absl::StrCat(where, " (table '", h.table(), "'): tensor ", t,
                                                " does not match its checksum"));
      }
    }
    SHOAL_RETURN_IF_ERROR(visit(data));
  }
}

namespace {

// Rows per chunk of a table checkpoint: 64Ki rows of 16 floats and two
// slots are 12 MiB in memory at a time, whatever the table.
constexpr int64_t kTableChunkRows = 1 << 16;

}  // namespace

absl::StatusOr<bool> SaveTables(const TableStore& tables, const std::string& path) {
  const std::unique_lock<std::mutex> no_restore = tables.LockForCheckpoint();
  const std::vector<EmbeddingTable*> all = tables.All();
  if (all.empty()) return false;
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<TableCheckpointWriter> writer, TableCheckpointWriter::Open(path));
  for (const EmbeddingTable* table : all) {
    SHOAL_RETURN_IF_ERROR(table->ForEachChunk(kTableChunkRows, [&](const SavedRows& rows, int64_t pushes) {
      TableChunkData chunk;
      chunk.header.set_table(table->def().name());
      chunk.header.set_dim(table->def().dim());
      chunk.header.set_optimizer(table->def().optimizer().kind());
      chunk.header.set_pushes(pushes);
      chunk.rows = rows;
      return writer->Append(std::move(chunk));
    }));
  }
  SHOAL_RETURN_IF_ERROR(writer->Finish());
  return true;
}

absl::StatusOr<int64_t> RestoreTables(const TableStore& tables, const std::vector<std::string>& files,
                                      const std::map<std::string, std::vector<int64_t>>* only) {
  const std::unique_lock<std::mutex> no_save = tables.LockForCheckpoint();
  auto table_of = [&](const TableChunkData& chunk, const std::string& file) -> absl::StatusOr<EmbeddingTable*> {
    auto table = tables.Find(chunk.header.table());
    if (!table.ok()) return Annotate(table.status(), absl::StrCat("restoring '", file, "'"));
    return *table;
  };
  // The ids of a chunk to restore: every one (a null list), those `only`
  // names, or none (nullopt: no row of its table is wanted).
  auto ids_wanted = [&](const TableChunkData& chunk) -> std::optional<const std::vector<int64_t>*> {
    if (only == nullptr) return nullptr;
    auto wanted = only->find(chunk.header.table());
    if (wanted == only->end()) return std::nullopt;
    return &wanted->second;
  };
  // The whole checkpoint puts each of its tables back to it (rows made since
  // go); an evaluator's chosen ids are added to what the tables hold.
  const bool replacing = only == nullptr;
  // Everything is checked before a row changes: each chunk fits its table,
  // and each dynamic table has room for the rows the files bring.
  std::map<EmbeddingTable*, int64_t> new_rows;
  for (const std::string& file : files) {
    SHOAL_RETURN_IF_ERROR(ReadTableCheckpoint(file, [&](const TableChunkData& chunk) -> absl::Status {
      SHOAL_ASSIGN_OR_RETURN(EmbeddingTable * table, table_of(chunk, file));
      SHOAL_RETURN_IF_ERROR(
          Annotate(table->CheckRestore(chunk.header, chunk.rows), absl::StrCat("restoring '", file, "'")));
      const auto wanted = ids_wanted(chunk);
      if (wanted && !chunk.rows.sightings()) new_rows[table] += table->RowsRestoreMakes(chunk.rows.ids, *wanted, replacing);
      return absl::OkStatus();
    }));
  }
  SHOAL_RETURN_IF_ERROR(tables.CheckRoomToRestore(new_rows, replacing));
  if (replacing) {
    for (const auto& [table, rows] : new_rows) table->DropRowsToRestore();
  }
  int64_t taken = 0;
  for (const std::string& file : files) {
    SHOAL_RETURN_IF_ERROR(ReadTableCheckpoint(file, [&](const TableChunkData& chunk) -> absl::Status {
      SHOAL_ASSIGN_OR_RETURN(EmbeddingTable * table, table_of(chunk, file));
      const auto wanted = ids_wanted(chunk);
      if (wanted) taken += table->Restore(chunk.header, chunk.rows, *wanted);
      return absl::OkStatus();
    }));
  }
  return taken;
}

}  // namespace shoal
