// How shoal frames a call in UCX active messages, after the handshake
// (handshake.h) has given the connection its id and secret.
//
// A request is active message kRequestAm, an answer kResponseAm. The
// active message's header starts with shoal's fixed header below; the
// codec's header frame (`frame_bytes`, core/codec.h) follows it there when
// it fits (UCX's max_am_header): the data is then the tensors alone, so a
// single tensor goes from its own memory with no copy of shoal's.
// Otherwise the frame leads the data, and the tensor bytes follow it at the
// next kBodyAlignment. The receiver tells the two apart by the header's
// length. Fields are in the sender's byte order: UCX connects a host's
// tasks and a cluster's hosts of one architecture.
#ifndef SHOAL_TRANSPORT_UCX_AM_FORMAT_H_
#define SHOAL_TRANSPORT_UCX_AM_FORMAT_H_

#include <cstddef>
#include <cstdint>

#include "shoal/transport/ucx/handshake.h"

namespace shoal {

inline constexpr unsigned kRequestAm = 11;
inline constexpr unsigned kResponseAm = 12;
// Tensor bytes start at this alignment after a header frame that leads the
// data, so that the receiver can decode every tensor in place.
inline constexpr size_t kBodyAlignment = 8;

struct RequestAmHeader {
  uint64_t connection_id;    // from the Welcome
  ConnectionSecret secret;   // from the Welcome: a request without it is dropped unread
  uint64_t call_id;          // echoed in the answer
  uint64_t frame_bytes;
};

struct ResponseAmHeader {
  uint64_t call_id;
  uint64_t frame_bytes;
};

}  // namespace shoal

#endif  // SHOAL_TRANSPORT_UCX_AM_FORMAT_H_
