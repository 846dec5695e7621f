// GrpcTransport: tasks in separate processes or machines, over gRPC.
//
// This folder is the only place that includes grpcpp. The service is a
// generic (byte-level) gRPC method, /shoal.VariableService/Call, whose
// payload is the wire codec's frame: protobuf header, then raw tensor bytes.
// Keeping tensors out of protobuf lets a send hand gRPC slices over the
// tensors' own memory (no copy) and a receive copy each tensor once.
//
// Each channel keeps `connections_per_peer` real TCP connections and spreads
// calls over them; callers keep several calls in flight. Servers bind where
// told; the launcher and examples use loopback unless told otherwise. A
// shared token and TLS (or mutual TLS) secure a cluster on a network.
#ifndef SHOAL_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
#define SHOAL_TRANSPORT_GRPC_GRPC_TRANSPORT_H_

#include "shoal/transport/blocking_executor.h"
#include "shoal/transport/transport.h"

namespace shoal {

// TLS from PEM files. With a certificate, servers serve TLS and clients
// verify servers against `ca_file`; with `mutual`, servers also require a
// client certificate signed by `ca_file`, and clients present theirs.
struct GrpcTlsOptions {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  bool mutual = false;
  bool enabled() const { return !ca_file.empty() || !cert_file.empty(); }
};

struct GrpcOptions {
  size_t max_message_bytes = 512ull << 20;  // tensor payload; larger is ResourceExhausted
  int connections_per_peer = 2;
  int server_threads = 0;  // 0: gRPC's default callback executor
  // Calls that may wait (long polls) run on this executor (null: the
  // process's shared one), never on gRPC's few callback threads; beyond its
  // bound they are answered RESOURCE_EXHAUSTED at once, so that a flood of
  // polls cannot exhaust the process's threads.
  std::shared_ptr<BlockingExecutor> executor;
  // A shared secret: clients send it with every call, servers refuse a call
  // without it (UNAUTHENTICATED, before any handler runs). Empty: none.
  std::string token;
  GrpcTlsOptions tls;
};

class GrpcTransport final : public Transport {
 public:
  explicit GrpcTransport(GrpcOptions options = {}) : options_(options) {}

  absl::StatusOr<std::unique_ptr<ServerHandle>> Serve(const std::string& address,
                                                      VariableService* service) override;
  absl::StatusOr<std::shared_ptr<Channel>> Connect(const TaskId& task, const std::string& address) override;

 private:
  GrpcOptions options_;
};

// Makes glibc keep large freed blocks for reuse instead of unmapping them.
// Without it every multi-MiB message maps fresh zeroed pages (page faults
// dominate at gRPC speeds). Process-wide, so binaries call it from main().
void KeepLargeAllocationsMapped();

}  // namespace shoal

#endif  // SHOAL_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
