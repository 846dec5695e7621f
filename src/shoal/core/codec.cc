#include "shoal/core/codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "shoal/core/dtype.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

constexpr size_t kLengthPrefixBytes = 4;
// Below this a copy is cheaper than the bookkeeping of sharing a chunk.
constexpr size_t kZeroCopyMinBytes = 4096;

// Reads consecutive bytes out of a list of chunks without joining them.
class ChunkReader {
 public:
  explicit ChunkReader(absl::Span<const absl::string_view> chunks) : chunks_(chunks) {
    for (auto c : chunks) remaining_ += c.size();
  }
  size_t remaining() const { return remaining_; }

  // If the next n bytes sit inside one chunk, returns where, and skips them.
  const char* TakeContiguous(size_t n, size_t* chunk_index) {
    if (n == 0 || chunk_ >= chunks_.size() || chunks_[chunk_].size() - offset_ < n) return nullptr;
    const char* p = chunks_[chunk_].data() + offset_;
    *chunk_index = chunk_;
    remaining_ -= n;
    offset_ += n;
    if (offset_ == chunks_[chunk_].size()) {
      ++chunk_;
      offset_ = 0;
    }
    return p;
  }

  // Copies the next n bytes to dst; the caller has checked remaining().
  void Read(void* dst, size_t n) {
    char* out = static_cast<char*>(dst);
    remaining_ -= n;
    while (n > 0) {
      absl::string_view c = chunks_[chunk_];
      size_t take = std::min(n, c.size() - offset_);
      std::memcpy(out, c.data() + offset_, take);
      out += take;
      n -= take;
      offset_ += take;
      if (offset_ == c.size()) {
        ++chunk_;
        offset_ = 0;
      }
    }
  }

 private:
  absl::Span<const absl::string_view> chunks_;
  size_t chunk_ = 0, offset_ = 0, remaining_ = 0;
};

// Both headers keep their tensor list in field 15, at the top level.
constexpr int kTensorsField = 15;
static_assert(wire::RequestHeader::kTensorsFieldNumber == kTensorsField);
static_assert(wire::ResponseHeader::kTensorsFieldNumber == kTensorsField);

// Walks the serialized header's top-level tags without building anything and
// refuses it if it lists more tensors than a message may carry.
absl::Status CheckTensorCount(absl::string_view serialized) {
  using google::protobuf::internal::WireFormatLite;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(serialized.data()),
                                            static_cast<int>(serialized.size()));
  int tensors = 0;
  while (uint32_t tag = in.ReadTag()) {
    if (WireFormatLite::GetTagFieldNumber(tag) == kTensorsField && ++tensors > kMaxTensorsPerMessage) {
      return absl::ResourceExhaustedError(absl::StrCat("message lists more than ", kMaxTensorsPerMessage,
                                                       " tensors, the most one message may carry"));
    }
    if (!WireFormatLite::SkipField(&in, tag)) return absl::DataLossError("garbled message: the header does not parse");
  }
  if (!in.ConsumedEntireMessage() || in.CurrentPosition() != static_cast<int>(serialized.size())) {
    return absl::DataLossError("garbled message: the header does not parse");
  }
  return absl::OkStatus();
}

absl::Status FillMeta(const std::vector<torch::Tensor>& tensors,
                      google::protobuf::RepeatedPtrField<wire::TensorMeta>* metas,
                      EncodedMessage* out) {
  metas->Clear();
  if (tensors.size() > static_cast<size_t>(kMaxTensorsPerMessage)) {
    return absl::InvalidArgumentError(absl::StrCat("a message of ", tensors.size(), " tensors exceeds the limit of ",
                                                   kMaxTensorsPerMessage, "; send fewer per request"));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const torch::Tensor& t = tensors[i];
    const std::optional<wire::DType> dtype = t.defined() ? WireDType(t.scalar_type()) : std::nullopt;
    if (!dtype || !t.device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", i, " of the message is not a defined float32 or int64 CPU tensor"));
    }
    torch::Tensor body = t.contiguous();
    wire::TensorMeta* meta = metas->Add();
    meta->set_dtype(*dtype);
    for (int64_t d : body.sizes()) meta->add_shape(d);
    meta->set_byte_size(body.nbytes());
    out->total_bytes += meta->byte_size();
    out->bodies.push_back(std::move(body));
  }
  return absl::OkStatus();
}

template <typename Header>
absl::StatusOr<EncodedMessage> Encode(Header header, const std::vector<torch::Tensor>& tensors) {
  EncodedMessage out;
  SHOAL_RETURN_IF_ERROR(FillMeta(tensors, header.mutable_tensors(), &out));
  std::string serialized = header.SerializeAsString();
  uint32_t length = static_cast<uint32_t>(serialized.size());
  out.header_frame.resize(kLengthPrefixBytes);
  for (size_t i = 0; i < kLengthPrefixBytes; ++i) out.header_frame[i] = static_cast<char>(length >> (8 * i));
  out.header_frame += serialized;
  out.total_bytes += out.header_frame.size();
  return out;
}

template <typename Header>
absl::Status Decode(absl::Span<const absl::string_view> chunks, size_t max_bytes,
                    Header* header, std::vector<torch::Tensor>* tensors,
                    absl::Span<const ChunkOwner> owners) {
  ChunkReader reader(chunks);
  if (reader.remaining() > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "message of ", reader.remaining(), " bytes exceeds the limit of ", max_bytes, " bytes"));
  }
  if (reader.remaining() < kLengthPrefixBytes) {
    return absl::DataLossError(absl::StrCat("garbled message: ", reader.remaining(),
                                            " bytes, shorter than its length prefix"));
  }
  unsigned char prefix[kLengthPrefixBytes];
  reader.Read(prefix, kLengthPrefixBytes);
  uint32_t length = 0;
  for (size_t i = 0; i < kLengthPrefixBytes; ++i) length |= uint32_t{prefix[i]} << (8 * i);
  if (length > reader.remaining()) {
    return absl::DataLossError(absl::StrCat("garbled message: header of ", length,
                                            " bytes but only ", reader.remaining(), " follow"));
  }
  if (length > kMaxHeaderBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("message header of ", length, " bytes exceeds the limit of ",
                                                     kMaxHeaderBytes, " bytes"));
  }
  std::string serialized(length, '\0');
  reader.Read(serialized.data(), length);
  SHOAL_RETURN_IF_ERROR(CheckTensorCount(serialized));
  if (!header->ParseFromString(serialized)) {
    return absl::DataLossError("garbled message: the header does not parse");
  }
  uint64_t body_bytes = 0;
  for (int i = 0; i < header->tensors_size(); ++i) {
    const wire::TensorMeta& meta = header->tensors(i);
    // On the wire a dtype is always set: unset (0) is refused like an unknown one.
    const std::optional<torch::ScalarType> dtype =
        meta.dtype() == wire::DTYPE_INVALID ? std::nullopt : TorchDType(meta.dtype());
    if (!dtype) {
      const std::string name = wire::DType_IsValid(meta.dtype()) ? wire::DType_Name(meta.dtype()) : "";
      return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " has dtype ",
                                                     name.empty() ? absl::StrCat("number ", meta.dtype()) : name,
                                                     "; only float32 and int64 are supported"));
    }
    const uint64_t element_bytes = c10::elementSize(*dtype);
    uint64_t numel = 1;
    for (int64_t d : meta.shape()) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " has a negative dimension"));
      if (d > 0 && numel > max_bytes / static_cast<uint64_t>(d)) {
        return absl::ResourceExhaustedError(absl::StrCat("tensor ", i, " shape exceeds the size limit"));
      }
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * element_bytes != meta.byte_size()) {
      return absl::DataLossError(absl::StrCat("garbled message: tensor ", i, " has ",
                                              meta.byte_size(), " bytes for ", numel, " elements"));
    }
    body_bytes += meta.byte_size();
  }
  if (body_bytes != reader.remaining()) {
    return absl::DataLossError(absl::StrCat("garbled message: header announces ", body_bytes,
                                            " tensor bytes but ", reader.remaining(), " follow"));
  }
  tensors->clear();
  tensors->reserve(header->tensors_size());
  for (const wire::TensorMeta& meta : header->tensors()) {
    std::vector<int64_t> shape(meta.shape().begin(), meta.shape().end());
    const torch::ScalarType dtype = *TorchDType(meta.dtype());  // checked above
    if (owners.size() == chunks.size() && meta.byte_size() >= kZeroCopyMinBytes) {
      ChunkReader peek = reader;
      size_t chunk = 0;
      const char* p = peek.TakeContiguous(meta.byte_size(), &chunk);
      if (p != nullptr && reinterpret_cast<uintptr_t>(p) % c10::elementSize(dtype) == 0) {
        reader = peek;
        ChunkOwner owner = owners[chunk];
        tensors->push_back(torch::from_blob(const_cast<char*>(p), shape, [owner](void*) {}, dtype));
        continue;
      }
    }
    torch::Tensor t = torch::empty(shape, dtype);
    reader.Read(t.data_ptr(), meta.byte_size());
    tensors->push_back(std::move(t));
  }
  header->clear_tensors();
  return absl::OkStatus();
}

}  // namespace

size_t TensorBytes(const std::vector<torch::Tensor>& tensors) {
  size_t bytes = 0;
  for (const auto& t : tensors) bytes += t.defined() ? t.numel() * t.element_size() : 0;
  return bytes;
}

std::string EncodedMessage::Flatten() const {
  std::string out;
  out.reserve(total_bytes);
  out += header_frame;
  for (const auto& body : bodies) {
    out.append(static_cast<const char*>(body.data_ptr()), body.nbytes());
  }
  return out;
}

absl::StatusOr<EncodedMessage> EncodeRequest(const Request& request) {
  return Encode(request.header, request.tensors);
}
absl::StatusOr<EncodedMessage> EncodeResponse(const Response& response) {
  return Encode(response.header, response.tensors);
}
absl::Status DecodeRequest(absl::Span<const absl::string_view> chunks, size_t max_bytes,
                           Request* request, absl::Span<const ChunkOwner> owners) {
  return Decode(chunks, max_bytes, &request->header, &request->tensors, owners);
}
absl::Status DecodeResponse(absl::Span<const absl::string_view> chunks, size_t max_bytes,
                            Response* response, absl::Span<const ChunkOwner> owners) {
  return Decode(chunks, max_bytes, &response->header, &response->tensors, owners);
}

}  // namespace shoal
