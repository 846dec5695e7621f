// The HTTP/2 and TCP settings GrpcTransport gives its channels and servers,
// shared with the transport benchmark's bare-gRPC ceiling so that both run
// gRPC alike. Includes grpcpp: for this folder and bench/ only.
#ifndef SHOAL_TRANSPORT_GRPC_GRPC_TUNING_H_
#define SHOAL_TRANSPORT_GRPC_GRPC_TUNING_H_

#include <grpcpp/grpcpp.h>

namespace shoal {

// Bulk tensors: the largest frames HTTP/2 allows, a flow-control lookahead
// that lets a 16 MiB message go without waiting for window updates, and
// large socket reads.
void TuneForBulkTransfer(grpc::ChannelArguments& args);
void TuneForBulkTransfer(grpc::ServerBuilder& builder);

}  // namespace shoal

#endif  // SHOAL_TRANSPORT_GRPC_GRPC_TUNING_H_
