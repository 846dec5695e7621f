#include "shoal/server/checkpoint_shard.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "shoal/core/crc32c.h"
#include "shoal/core/dtype.h"
#include "shoal/core/status.h"
#include "shoal/wire.pb.h"

namespace shoal {
namespace {

constexpr char kMagic[] = "SHOALCKP";
constexpr char kEnd[] = "SHOALEND";
constexpr size_t kTagSize = 8;

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

absl::Status ErrnoError(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " '", path, "': ", std::strerror(errno)));
}

absl::Status SyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) return ErrnoError("cannot open", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return ErrnoError("cannot fsync", path);
  return absl::OkStatus();
}

// Reads a shard's bytes in order; every read is checked against what is left.
class Reader {
 public:
  Reader(const std::string& bytes, const std::string& path) : bytes_(bytes), path_(path) {}

  absl::Status Take(size_t n, const std::string& what, const char** out) {
    if (n > bytes_.size() - position_) {
      return absl::DataLossError(absl::StrCat("checkpoint shard '", path_, "' is truncated: ", what, " needs ", n,
                                              " bytes at offset ", position_, ", ", bytes_.size() - position_,
                                              " are left"));
    }
    *out = bytes_.data() + position_;
    position_ += n;
    return absl::OkStatus();
  }

  absl::StatusOr<uint32_t> U32(const std::string& what) {
    const char* p = nullptr;
    SHOAL_RETURN_IF_ERROR(Take(4, what, &p));
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(p[i])} << (8 * i);
    return v;
  }

  bool AtEnd() const { return position_ == bytes_.size(); }

 private:
  const std::string& bytes_;
  const std::string& path_;
  size_t position_ = 0;
};

// Elements of `shape`, or an error when a dimension is negative or the
// product overflows what the file could hold.
absl::StatusOr<int64_t> Elements(const wire::CheckpointTensor& tensor) {
  int64_t n = 1;
  for (int64_t d : tensor.shape()) {
    if (d < 0 || (d > 0 && n > std::numeric_limits<int64_t>::max() / 8 / d)) {
      return absl::DataLossError("a tensor shape is negative or overflows");
    }
    n *= d;
  }
  return n;
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) return ErrnoError("cannot create", temp);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) return ErrnoError("cannot write", temp);
  }
  return CommitFile(temp, path);
}

absl::Status CommitFile(const std::string& temp, const std::string& path) {
  SHOAL_RETURN_IF_ERROR(SyncPath(temp, O_RDONLY));
  if (std::rename(temp.c_str(), path.c_str()) != 0) return ErrnoError("cannot rename to", path);
  std::string dir = std::filesystem::path(path).parent_path().string();
  return SyncPath(dir.empty() ? "." : dir, O_RDONLY | O_DIRECTORY);
}

absl::Status WriteShard(const std::string& path, const std::vector<SavedVariable>& variables) {
  std::string out(kMagic, kTagSize);
  PutU32(&out, kCheckpointFormatVersion);
  PutU32(&out, static_cast<uint32_t>(variables.size()));
  for (const SavedVariable& v : variables) {
    std::vector<torch::Tensor> tensors = {v.value.contiguous()};
    for (const auto& s : v.slots.tensors) tensors.push_back(s.contiguous());
    wire::CheckpointRecord record;
    record.set_name(v.name);
    record.set_optimizer(v.optimizer);
    record.set_optimizer_step(v.slots.step);
    for (const auto& t : tensors) {
      const std::optional<wire::DType> dtype = WireDType(t.scalar_type());
      if (!dtype) {
        return absl::InvalidArgumentError(absl::StrCat("checkpoint: variable '", v.name, "' is ",
                                                       DTypeName(t.scalar_type()), ", not float32 or int64"));
      }
      auto* meta = record.add_tensors();
      meta->set_dtype(*dtype);
      for (int64_t d : t.sizes()) meta->add_shape(d);
      meta->set_crc32c(Crc32c(t.data_ptr(), t.nbytes()));
    }
    const std::string header = record.SerializeAsString();
    PutU32(&out, static_cast<uint32_t>(header.size()));
    PutU32(&out, Crc32c(header.data(), header.size()));
    out += header;
    for (const auto& t : tensors) out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  out.append(kEnd, kTagSize);
  PutU32(&out, static_cast<uint32_t>(variables.size()));
  return WriteFileAtomically(path, out);
}

absl::StatusOr<std::vector<SavedVariable>> ReadShard(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("checkpoint shard '", path, "' cannot be opened"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseShard(buffer.str(), path);
}

absl::StatusOr<std::vector<SavedVariable>> ParseShard(const std::string& bytes, const std::string& path) {
  Reader reader(bytes, path);
  const char* tag = nullptr;
  SHOAL_RETURN_IF_ERROR(reader.Take(kTagSize, "the magic number", &tag));
  if (std::memcmp(tag, kMagic, kTagSize) != 0) {
    return absl::DataLossError(absl::StrCat("'", path, "' is not a shoal checkpoint shard (bad magic number)"));
  }
  SHOAL_ASSIGN_OR_RETURN(uint32_t version, reader.U32("the format version"));
  if (version != kCheckpointFormatVersion) {
    return absl::DataLossError(absl::StrCat("checkpoint shard '", path, "' has format version ", version,
                                            "; this shoal reads version ", kCheckpointFormatVersion));
  }
  SHOAL_ASSIGN_OR_RETURN(uint32_t count, reader.U32("the record count"));
  std::vector<SavedVariable> variables;
  for (uint32_t i = 0; i < count; ++i) {
    const std::string where = absl::StrCat("record ", i);
    SHOAL_ASSIGN_OR_RETURN(uint32_t header_size, reader.U32(where + "'s header size"));
    SHOAL_ASSIGN_OR_RETURN(uint32_t header_crc, reader.U32(where + "'s header checksum"));
    const char* header = nullptr;
    SHOAL_RETURN_IF_ERROR(reader.Take(header_size, where + "'s header", &header));
    wire::CheckpointRecord record;
    if (Crc32c(header, header_size) != header_crc || !record.ParseFromArray(header, static_cast<int>(header_size))) {
      return absl::DataLossError(absl::StrCat("checkpoint shard '", path, "': the header of ", where,
                                              variables.empty() ? "" : absl::StrCat(" (after variable '", variables.back().name, "')"),
                                              " fails its CRC32C (the file is corrupt)"));
    }
    if (record.tensors_size() < 1) {
      return absl::DataLossError(absl::StrCat("checkpoint shard '", path, "': variable '", record.name(),
                                              "' has no value"));
    }
    SavedVariable v;
    v.name = record.name();
    v.optimizer = record.optimizer();
    v.slots.step = record.optimizer_step();
    for (int t = 0; t < record.tensors_size(); ++t) {
      const wire::CheckpointTensor& meta = record.tensors(t);
      const std::string what = t == 0 ? "value" : absl::StrCat("slot ", t - 1);
      auto elements = Elements(meta);
      if (!elements.ok()) {
        return absl::DataLossError(absl::StrCat("checkpoint shard '", path, "': variable '", v.name, "' ", what,
                                                ": ", elements.status().message()));
      }
      const std::optional<torch::ScalarType> dtype = TorchDType(meta.dtype());
      if (!dtype) {
        return absl::DataLossError(absl::StrCat("checkpoint shard '", path, "': variable '", v.name, "' ", what,
                                                " has unknown dtype number ", meta.dtype()));
      }
      const size_t bytes = static_cast<size_t>(*elements) * c10::elementSize(*dtype);
      const char* data = nullptr;
      SHOAL_RETURN_IF_ERROR(reader.Take(bytes, absl::StrCat("variable '", v.name, "' ", what), &data));
      const uint32_t crc = Crc32c(data, bytes);
      if (crc != meta.crc32c()) {
        return absl::DataLossError(absl::StrCat("checkpoint shard '", path, "': variable '", v.name, "' ", what,
                                                " fails its CRC32C (stored ", meta.crc32c(), ", computed ", crc,
                                                "): the data is corrupt"));
      }
      std::vector<int64_t> shape(meta.shape().begin(), meta.shape().end());
      torch::Tensor tensor = torch::empty(shape, *dtype);
      std::memcpy(tensor.data_ptr(), data, bytes);
      if (t == 0) {
        v.value = tensor;
      } else {
        v.slots.tensors.push_back(tensor);
      }
    }
    variables.push_back(std::move(v));
  }
  SHOAL_RETURN_IF_ERROR(reader.Take(kTagSize, "the end marker", &tag));
  SHOAL_ASSIGN_OR_RETURN(uint32_t end_count, reader.U32("the end marker's count"));
  if (std::memcmp(tag, kEnd, kTagSize) != 0 || end_count != count || !reader.AtEnd()) {
    return absl::DataLossError(absl::StrCat("checkpoint shard '", path, "' has a bad end marker"));
  }
  return variables;
}

std::string CheckpointFolder(const std::string& dir, int64_t step) {
  return (std::filesystem::path(dir) / absl::StrCat(kCheckpointFolderPrefix, step)).string();
}

std::string ShardFileName(int shard) { return absl::StrCat("shard-", shard, ".ckpt"); }

}  // namespace shoal
