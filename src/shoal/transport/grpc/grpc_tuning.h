// The gRPC settings GrpcTransport gives its channels and servers, shared
// with the transport benchmark's bare-gRPC ceiling so that both run gRPC
// alike. Includes grpcpp: for this folder and bench/ only.
#ifndef SHOAL_TRANSPORT_GRPC_GRPC_TUNING_H_
#define SHOAL_TRANSPORT_GRPC_GRPC_TUNING_H_

#include <grpcpp/grpcpp.h>

namespace shoal {

// The arguments of connection `index` to a peer: a TCP connection of its
// own, quick reconnects (tasks start in any order), messages up to
// `message_limit` bytes (-1: any), and settings for bulk tensors.
grpc::ChannelArguments PeerChannelArguments(int index, int message_limit);

// A server's settings: messages up to `message_limit` bytes (-1: any), an
// address no other server may share, and settings for bulk tensors.
void ConfigureServer(grpc::ServerBuilder& builder, int message_limit);

}  // namespace shoal

#endif  // SHOAL_TRANSPORT_GRPC_GRPC_TUNING_H_
