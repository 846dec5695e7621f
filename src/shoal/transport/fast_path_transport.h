// FastPathTransport: gRPC for reaching a task, a fast transport (UCX) for
// the tensors.
//
// A server serves gRPC at the task's address, as the cluster spec names it,
// and the fast transport beside it on a free port of the same host, which
// the gRPC server advertises (an `endpoints` request; the fast server
// starts first, so that every answer names it). So TF_CONFIG and
// cluster files stay as they are: a channel asks the task over gRPC once,
// then sends every call over the fast transport to that port. A task that
// advertises none (transport.kind: grpc, or TLS) is called over gRPC. When
// a fast connection is lost, the channel asks again on the next call (the
// task may have restarted elsewhere). Once the fast route has carried a
// call, a RouteTrial now and then counts calls over each route, and the
// channel keeps to gRPC while gRPC carries clearly more (a busy machine);
// unless the transport was made without route trials.
//
// Thread-safe. Servers and channels must not outlive the transport.
#ifndef SHOAL_TRANSPORT_FAST_PATH_TRANSPORT_H_
#define SHOAL_TRANSPORT_FAST_PATH_TRANSPORT_H_

#include <memory>
#include <string>

#include "shoal/transport/transport.h"

namespace shoal {

class FastPathTransport final : public Transport {
 public:
  // `control` reaches tasks at their cluster addresses (gRPC); `fast`
  // carries the calls once a task has said where it serves it; `fast_kind`
  // names it in the advertisement ("ucx"). `try_routes`: whether channels
  // run route trials (transport.kind auto); without, a reachable fast
  // route carries every call (transport.kind ucx).
  FastPathTransport(std::unique_ptr<Transport> control, std::unique_ptr<Transport> fast, std::string fast_kind,
                    bool try_routes = true);

  absl::StatusOr<std::unique_ptr<ServerHandle>> Serve(const std::string& address,
                                                      VariableService* service) override;
  absl::StatusOr<std::shared_ptr<Channel>> Connect(const TaskId& task, const std::string& address) override;

 private:
  std::unique_ptr<Transport> control_;
  std::unique_ptr<Transport> fast_;
  std::string fast_kind_;
  bool try_routes_;
};

}  // namespace shoal

#endif  // SHOAL_TRANSPORT_FAST_PATH_TRANSPORT_H_
