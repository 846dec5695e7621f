// Request and Response: what one task asks of another, and the answer.
//
// A message is a protobuf header (proto/shoal/wire.proto) plus a list of
// dense float32 (or int64: buffers) tensors whose bytes stay outside protobuf. The in-process
// transport hands these structs across directly, so a response's tensors may
// alias a server's variable storage: read them, copy them, never write them.
#ifndef SHOAL_CORE_MESSAGE_H_
#define SHOAL_CORE_MESSAGE_H_

#include <torch/types.h>

#include <string>
#include <vector>

#include "shoal/wire.pb.h"

namespace shoal {

struct Request {
  wire::RequestHeader header;
  std::vector<torch::Tensor> tensors;
  // Who sent it, as the transport saw it ("ipv4:10.0.0.5:41234"); empty
  // in-process.
  std::string peer;
};

struct Response {
  wire::ResponseHeader header;
  std::vector<torch::Tensor> tensors;
};

// Total bytes of tensor payload: what size limits are checked against.
size_t TensorBytes(const std::vector<torch::Tensor>& tensors);

}  // namespace shoal

#endif  // SHOAL_CORE_MESSAGE_H_
