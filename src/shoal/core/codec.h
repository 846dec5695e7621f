// The wire codec: turns a Request/Response into bytes and back.
//
// Layout: [fixed32 LE header length][protobuf header][tensor bytes ...].
// Encoding copies nothing of the tensors: it returns the header frame and
// the (contiguous) tensors whose memory a transport sends as-is. Decoding
// takes the received bytes as a list of chunks (gRPC slices, or one string)
// and copies each tensor's bytes at most once into a fresh tensor. When the
// caller passes an owner for each chunk (a reference that keeps the chunk's
// memory alive), a tensor lying whole inside one suitably aligned chunk is
// not copied at all: it points into the chunk and holds its owner.
//
// Decoding trusts nothing: a short or garbled frame, an unknown dtype, a
// negative dimension, a byte size that disagrees with the shape, or a total
// over `max_bytes` is an error that says which. What a message can make the
// receiver build is bounded before anything is parsed: a header over
// kMaxHeaderBytes or listing more than kMaxTensorsPerMessage tensors is
// refused on its length and a scan of its tags, so a header of millions of
// empty tensors costs the receiver nothing beyond the bytes it read.
#ifndef SHOAL_CORE_CODEC_H_
#define SHOAL_CORE_CODEC_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "shoal/core/message.h"

namespace shoal {

// The most header bytes one message may carry (names, shapes, definitions):
// thousands of variables take a few hundred KiB.
inline constexpr size_t kMaxHeaderBytes = size_t{4} << 20;
// The most tensors one message may carry, and (checked by the server) the
// most names one request may list.
inline constexpr int kMaxTensorsPerMessage = 1 << 16;

struct EncodedMessage {
  std::string header_frame;            // length prefix + serialized header
  std::vector<torch::Tensor> bodies;   // contiguous float32 or int64, sent in order
  size_t total_bytes = 0;              // header_frame + all bodies

  // Concatenates everything into one string (tests, in-process serialisation).
  std::string Flatten() const;
};

absl::StatusOr<EncodedMessage> EncodeRequest(const Request& request);
absl::StatusOr<EncodedMessage> EncodeResponse(const Response& response);

// Keeps one received chunk's memory alive while a tensor points into it.
using ChunkOwner = std::shared_ptr<const void>;

absl::Status DecodeRequest(absl::Span<const absl::string_view> chunks,
                           size_t max_bytes, Request* request,
                           absl::Span<const ChunkOwner> owners = {});
absl::Status DecodeResponse(absl::Span<const absl::string_view> chunks,
                            size_t max_bytes, Response* response,
                            absl::Span<const ChunkOwner> owners = {});

}  // namespace shoal

#endif  // SHOAL_CORE_CODEC_H_
