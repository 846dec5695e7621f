#include "shoal/data/npy.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;
// numpy writes headers of a few hundred bytes; anything near this is not one.
constexpr size_t kMaxHeaderBytes = 1 << 16;

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("NPY file '", path, "': ", what));
}

// The value of `key` in the header's Python dict literal, as written:
// "'<f4'", "False", "(60000, 1, 28, 28)".
absl::StatusOr<std::string> HeaderValue(const std::string& header, const std::string& key,
                                        const std::string& path) {
  const std::string quoted = absl::StrCat("'", key, "':");
  const size_t at = header.find(quoted);
  if (at == std::string::npos) return Bad(path, absl::StrCat("the header has no '", key, "'"));
  size_t begin = at + quoted.size();
  while (begin < header.size() && header[begin] == ' ') ++begin;
  size_t end = begin;
  if (begin < header.size() && header[begin] == '(') {
    end = header.find(')', begin);
    if (end == std::string::npos) return Bad(path, "the header's shape is not closed");
    ++end;
  } else if (begin < header.size() && header[begin] == '\'') {
    end = header.find('\'', begin + 1);
    if (end == std::string::npos) return Bad(path, "the header's dtype is not closed");
    ++end;
  } else {
    end = header.find_first_of(",}", begin);
    if (end == std::string::npos) return Bad(path, absl::StrCat("the header's '", key, "' has no end"));
  }
  return header.substr(begin, end - begin);
}

absl::StatusOr<torch::ScalarType> ParseDescr(const std::string& descr, const std::string& path) {
  if (descr == "'<f4'") return torch::kFloat32;
  if (descr == "'|u1'" || descr == "'<u1'") return torch::kUInt8;
  if (descr == "'<i8'") return torch::kInt64;
  return Bad(path, absl::StrCat("dtype ", descr,
                                " is not one shoal reads: features are float32 ('<f4') or uint8 ('|u1'), "
                                "labels int64 ('<i8')"));
}

absl::StatusOr<std::vector<int64_t>> ParseShape(const std::string& text, const std::string& path) {
  absl::string_view inner = text;
  if (!absl::ConsumePrefix(&inner, "(") || !absl::ConsumeSuffix(&inner, ")")) {
    return Bad(path, absl::StrCat("shape ", text, " is not a tuple"));
  }
  std::vector<int64_t> shape;
  for (absl::string_view part : absl::StrSplit(inner, ',', absl::SkipWhitespace())) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &d) || d < 0) {
      return Bad(path, absl::StrCat("shape ", text, " has a dimension that is not a size"));
    }
    shape.push_back(d);
  }
  return shape;
}

}  // namespace

absl::StatusOr<torch::Tensor> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("NPY file '", path, "' cannot be opened"));
  in.seekg(0, std::ios::end);
  const uint64_t file_bytes = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  char preamble[kMagicBytes + 2];
  if (!in.read(preamble, sizeof(preamble)) || std::memcmp(preamble, kMagic, kMagicBytes) != 0) {
    return Bad(path, "not an NPY file (bad magic number)");
  }
  const int major = static_cast<unsigned char>(preamble[kMagicBytes]);
  if (major < 1 || major > 3) return Bad(path, absl::StrCat("format version ", major, " is unknown (1 to 3 are)"));
  uint64_t header_bytes = 0;
  const int length_bytes = major == 1 ? 2 : 4;
  unsigned char length[4] = {0, 0, 0, 0};
  if (!in.read(reinterpret_cast<char*>(length), length_bytes)) return Bad(path, "truncated in its header length");
  for (int i = 0; i < length_bytes; ++i) header_bytes |= uint64_t{length[i]} << (8 * i);
  if (header_bytes > kMaxHeaderBytes) return Bad(path, absl::StrCat("a header of ", header_bytes, " bytes"));
  std::string header(header_bytes, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_bytes))) return Bad(path, "truncated in its header");

  auto descr = HeaderValue(header, "descr", path);
  if (!descr.ok()) return descr.status();
  auto fortran = HeaderValue(header, "fortran_order", path);
  if (!fortran.ok()) return fortran.status();
  auto shape_text = HeaderValue(header, "shape", path);
  if (!shape_text.ok()) return shape_text.status();
  auto dtype = ParseDescr(*descr, path);
  if (!dtype.ok()) return dtype.status();
  if (*fortran != "False") {
    return Bad(path, "the array is in Fortran order; save it C-ordered (numpy.ascontiguousarray)");
  }
  auto shape = ParseShape(*shape_text, path);
  if (!shape.ok()) return shape.status();

  const uint64_t element_bytes = c10::elementSize(*dtype);
  uint64_t elements = 1;
  for (int64_t d : *shape) {
    if (d > 0 && elements > std::numeric_limits<uint64_t>::max() / element_bytes / static_cast<uint64_t>(d)) {
      return Bad(path, absl::StrCat("shape ", *shape_text, " overflows"));
    }
    elements *= static_cast<uint64_t>(d);
  }
  const uint64_t data_offset = kMagicBytes + 2 + length_bytes + header_bytes;
  const uint64_t data_bytes = elements * element_bytes;
  if (file_bytes - data_offset != data_bytes) {
    return Bad(path, absl::StrCat("shape ", *shape_text, " needs ", data_bytes, " bytes of data; the file has ",
                                  file_bytes - data_offset, file_bytes - data_offset < data_bytes ? " (truncated)" : ""));
  }
  torch::Tensor tensor = torch::empty(*shape, *dtype);
  if (!in.read(static_cast<char*>(tensor.data_ptr()), static_cast<std::streamsize>(data_bytes))) {
    return Bad(path, "truncated in its data");
  }
  return tensor;
}

namespace {

absl::StatusOr<std::string> Descr(torch::ScalarType type, const std::string& path) {
  switch (type) {
    case torch::kFloat32:
      return std::string("<f4");
    case torch::kUInt8:
      return std::string("|u1");
    case torch::kInt64:
      return std::string("<i8");
    default:
      return absl::InvalidArgumentError(absl::StrCat("NPY file '", path, "': float32, uint8 or int64 only"));
  }
}

// A version 1.0 preamble and header for an array of `descr` and `shape`,
// padded with spaces (as numpy pads it, so that the data starts 64-byte
// aligned) to at least `at_least` bytes.
std::string HeaderBlock(const std::string& descr, c10::IntArrayRef shape, size_t at_least = 0) {
  std::string dims = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) dims += ",";
  std::string header = absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", dims, "), }");
  const size_t preamble = kMagicBytes + 2 + 2;
  size_t length = preamble + header.size() + 1;
  length = std::max(length, at_least);
  length += (64 - length % 64) % 64;
  header.append(length - preamble - header.size() - 1, ' ');
  header += '\n';
  std::string block(kMagic, kMagicBytes);
  block += '\x01';
  block += '\x00';
  block += static_cast<char>(header.size() & 0xff);
  block += static_cast<char>(header.size() >> 8);
  return block + header;
}

}  // namespace

absl::Status WriteNpy(const std::string& path, const torch::Tensor& tensor) {
  SHOAL_ASSIGN_OR_RETURN(const std::string descr, Descr(tensor.scalar_type(), path));
  const torch::Tensor data = tensor.contiguous();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("WriteNpy: cannot create '", path, "'"));
  out << HeaderBlock(descr, data.sizes());
  out.write(static_cast<const char*>(data.data_ptr()), static_cast<std::streamsize>(data.nbytes()));
  if (!out) return absl::InternalError(absl::StrCat("WriteNpy: cannot write '", path, "'"));
  return absl::OkStatus();
}

// Room for any row count: the header is rewritten at the end, as long.
constexpr size_t kAppenderHeaderBytes = 192;

absl::StatusOr<std::unique_ptr<NpyAppender>> NpyAppender::Open(const std::string& path, torch::ScalarType dtype,
                                                               std::vector<int64_t> row_shape) {
  SHOAL_ASSIGN_OR_RETURN(std::string descr, Descr(dtype, path));
  std::unique_ptr<NpyAppender> appender(new NpyAppender(path, dtype, std::move(descr), std::move(row_shape)));
  appender->out_.open(path, std::ios::binary | std::ios::trunc);
  appender->header_bytes_ = appender->Header().size();
  appender->out_ << appender->Header();
  if (!appender->out_) return absl::InternalError(absl::StrCat("cannot create NPY file '", path, "'"));
  return appender;
}

std::string NpyAppender::Header() const {
  std::vector<int64_t> shape = {rows_};
  shape.insert(shape.end(), row_shape_.begin(), row_shape_.end());
  return HeaderBlock(descr_, shape, std::max(header_bytes_, kAppenderHeaderBytes));
}

absl::Status NpyAppender::Append(const torch::Tensor& rows) {
  if (rows.scalar_type() != dtype_ || rows.dim() != static_cast<int64_t>(row_shape_.size()) + 1 ||
      !rows.sizes().slice(1).equals(row_shape_)) {
    return absl::InvalidArgumentError(absl::StrCat("NPY file '", path_, "': rows of ", c10::toString(rows.scalar_type()),
                                                   " ", absl::StrJoin(rows.sizes(), "x"), " do not fit"));
  }
  const torch::Tensor data = rows.contiguous();
  out_.write(static_cast<const char*>(data.data_ptr()), static_cast<std::streamsize>(data.nbytes()));
  rows_ += rows.size(0);
  if (!out_) return absl::InternalError(absl::StrCat("cannot write NPY file '", path_, "'"));
  return absl::OkStatus();
}

absl::Status NpyAppender::Finish() {
  const std::string header = Header();
  if (header.size() != header_bytes_) return absl::InternalError(absl::StrCat("NPY file '", path_, "': header grew"));
  out_.seekp(0);
  out_ << header;
  out_.close();
  if (!out_) return absl::InternalError(absl::StrCat("cannot finish NPY file '", path_, "'"));
  return absl::OkStatus();
}

}  // namespace shoal
