// LocalFirstTransport: calls to a server of this very process go straight to
// it, through an InProcNetwork where such servers register besides serving
// over the network; calls to any other address go through `remote`. As
// TensorFlow's worker cache short-circuits the local task, a client and a
// ps in one process (the public API's ClusterClient and VariableServer)
// then skip the codec, the sockets and the copies.
//
// What changes for the caller over a local channel is what InProcTransport
// says: a read may alias the server's memory (copy before writing to it),
// and the call runs on the caller's thread. The token is not asked for: the
// caller is inside the process already.
//
// Thread-safe.
#ifndef SHOAL_TRANSPORT_LOCAL_FIRST_TRANSPORT_H_
#define SHOAL_TRANSPORT_LOCAL_FIRST_TRANSPORT_H_

#include <memory>
#include <string>

#include "shoal/transport/inproc/inproc_transport.h"
#include "shoal/transport/transport.h"

namespace shoal {

class LocalFirstTransport final : public Transport {
 public:
  // `local` is not owned and must outlive the transport and its channels.
  LocalFirstTransport(InProcNetwork* local, std::unique_ptr<Transport> remote)
      : local_network_(local), local_(local), remote_(std::move(remote)) {}

  // Serves through `remote` only: a server that wants local callers too
  // registers in the InProcNetwork itself (InProcTransport::Serve).
  absl::StatusOr<std::unique_ptr<ServerHandle>> Serve(const std::string& address,
                                                      VariableService* service) override {
    return remote_->Serve(address, service);
  }
  // Local if a server of this process is registered at `address` now.
  absl::StatusOr<std::shared_ptr<Channel>> Connect(const TaskId& task, const std::string& address) override {
    if (IsLocal(address)) return local_.Connect(task, address);
    return remote_->Connect(task, address);
  }
  bool IsLocal(const std::string& address) const { return local_network_->Find(address) != nullptr; }

 private:
  InProcNetwork* local_network_;
  InProcTransport local_;
  std::unique_ptr<Transport> remote_;
};

}  // namespace shoal

#endif  // SHOAL_TRANSPORT_LOCAL_FIRST_TRANSPORT_H_
