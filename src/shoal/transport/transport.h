// The transport seam: how a Request reaches another task's VariableService.
//
// Everything above this interface (client, strategies, sessions) is the same
// whatever carries the bytes. Implementations:
//   inproc/  direct calls into a VariableService in this process (no copy),
//            optionally through the wire codec to test serialisation;
//   grpc/    separate processes or machines; the only place grpcpp appears.
// Folder layout mirrors the interface, as in gloo's transport/.
#ifndef SHOAL_TRANSPORT_TRANSPORT_H_
#define SHOAL_TRANSPORT_TRANSPORT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "shoal/cluster/cluster_spec.h"
#include "shoal/core/message.h"
#include "shoal/server/variable_service.h"

namespace shoal {

// How tasks reach each other (config `transport:`).
struct TransportConfig {
  // auto (the default): tensors over UCX (shared memory on a host, TCP
  // between hosts), gRPC to reach each task, and gRPC for everything when
  // TLS is on (UCX does not encrypt), and gRPC for a channel while it
  // carries clearly more calls a second (a busy machine: RouteTrial);
  // grpc: gRPC only; ucx: every call over UCX once a task is reached,
  // refusing TLS, and failing where UCX cannot start.
  std::string kind = "auto";
  double rpc_timeout_s = 60;
  double startup_timeout_s = 120;  // how long tasks wait for each other at start
  int64_t max_message_mb = 512;
  int connections_per_peer = 2;
};

// A connection to one task. Thread-safe; calls may overlap.
class Channel {
 public:
  virtual ~Channel() = default;

  // Sends `request`; fills `*response` (which must live until `done` runs)
  // and calls `done` exactly once, possibly on another thread, possibly
  // before Call returns. The status passed to `done` is a transport failure
  // naming the task (Unavailable, DeadlineExceeded, ResourceExhausted...), or
  // else the server's own verdict from the response header.
  virtual void Call(const Request& request, Response* response, absl::Time deadline,
                    std::function<void(absl::Status)> done) = 0;

  const TaskId& task() const { return task_; }

 protected:
  explicit Channel(TaskId task) : task_(std::move(task)) {}

 private:
  TaskId task_;
};

// A running server. Destroying it stops it.
class ServerHandle {
 public:
  virtual ~ServerHandle() = default;
  // The address peers connect to (with the real port if 0 was asked for).
  virtual std::string address() const = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // Starts serving `service` (not owned; must outlive the handle) at `address`.
  virtual absl::StatusOr<std::unique_ptr<ServerHandle>> Serve(const std::string& address,
                                                              VariableService* service) = 0;

  // A channel to `task` at `address`. Connecting is lazy: an unreachable task
  // shows up as Unavailable on the first call, not here.
  virtual absl::StatusOr<std::shared_ptr<Channel>> Connect(const TaskId& task, const std::string& address) = 0;
};

// Blocking convenience over Channel::Call.
absl::Status CallAndWait(Channel& channel, const Request& request, Response* response, absl::Time deadline);

}  // namespace shoal

#endif  // SHOAL_TRANSPORT_TRANSPORT_H_
