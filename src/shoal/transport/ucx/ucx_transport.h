// UcxTransport: tensors between tasks over UCX, which picks shared memory
// (posix, cma) for a peer on the same host and TCP (or RDMA verbs where it
// finds them) for one on another, with no configuration.
//
// A connection starts with a handshake over a plain TCP socket at the
// task's fast address: the client sends the shared token and its UCX worker
// address; the server checks the token in constant time before it creates
// anything for the client, and answers with a connection id, a 128-bit
// secret and its own worker address. Requests then travel as UCX active
// messages that carry the id and the secret; a message without a valid pair
// is dropped before its data is fetched. The socket stays open for the life
// of the connection: when a peer's process ends, the kernel closes it and
// every call in flight to that peer fails UNAVAILABLE at once (UCX's
// shared-memory transports cannot report a dead peer themselves).
//
// Messages are the wire codec's frames, sent as a UCX I/O vector that
// points at the tensors' memory (no copy), with the tensor bytes aligned so
// that the receiver decodes them in place. Every call has a deadline; a
// message over the size limit is refused on its announced length, before
// anything is allocated. Requests that may wait run on a BlockingExecutor.
//
// Each server and each transport's client side has a UcxLoop for each lane
// (`connections_per_peer`): one thread that sleeps until a message, a
// socket or a deadline needs it.
// Servers and channels must not outlive their transport.
#ifndef SHOAL_TRANSPORT_UCX_UCX_TRANSPORT_H_
#define SHOAL_TRANSPORT_UCX_UCX_TRANSPORT_H_

#include <memory>
#include <string>

#include "shoal/transport/blocking_executor.h"
#include "shoal/transport/transport.h"

namespace shoal {

struct UcxOptions {
  size_t max_message_bytes = 512ull << 20;  // tensor payload; larger is ResourceExhausted
  // A shared secret checked in the handshake (empty: none).
  std::string token;
  // How long a connection attempt (TCP connect and handshake) may take.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Requests that may wait; null: BlockingExecutor::Shared().
  std::shared_ptr<BlockingExecutor> executor;
  // How long a loop keeps polling after it has worked before it sleeps,
  // yielding its core to any thread that wants it (a worker's compute):
  // answers that come sooner cost no wake-up (tens of microseconds on a
  // busy host). Idle loops sleep and use no CPU.
  absl::Duration stay_awake = absl::Microseconds(500);
  // UCX's own transport list (its UCX_TLS: "tcp", "posix,cma,tcp"...);
  // empty: UCX picks (or the UCX_TLS environment variable does).
  std::string ucx_transports;
  // The most connections a server holds at once; each has a UCX worker of
  // its own (about 1.1 MB of shared memory). The next is refused
  // (RESOURCE_EXHAUSTED naming the task).
  size_t max_connections = 256;
  // Lanes: a channel keeps this many connections to its task, each on its
  // own client loop thread, and a server serves on this many loop threads.
  // A call takes the lane with the fewest calls in flight, so overlapping
  // calls (and different clients of a server) move at once on a machine
  // with the cores for it; one call at a time keeps to lane 0. As gRPC's
  // connections_per_peer, and its default.
  int connections_per_peer = 2;
  // What the requests a server is receiving, over every connection, may
  // hold at once; a request beyond it is refused (RESOURCE_EXHAUSTED naming
  // the task) before its data is fetched. 0: two of the largest messages.
  size_t receive_budget_bytes = 0;
};

class UcxTransport final : public Transport {
 public:
  // Fails when UCX cannot start (no usable transport).
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(UcxOptions options = {});
  ~UcxTransport() override;

  absl::StatusOr<std::unique_ptr<ServerHandle>> Serve(const std::string& address,
                                                      VariableService* service) override;
  absl::StatusOr<std::shared_ptr<Channel>> Connect(const TaskId& task, const std::string& address) override;

 private:
  struct State;
  explicit UcxTransport(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace shoal

#endif  // SHOAL_TRANSPORT_UCX_UCX_TRANSPORT_H_
