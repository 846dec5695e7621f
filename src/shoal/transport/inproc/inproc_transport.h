// InProcTransport: tasks in one process, called directly.
//
// An InProcNetwork is the "wire" the tasks of one process share: a table
// from address to VariableService. It is an object owned by whoever builds
// the local cluster (no global registry), so tests can run many clusters side
// by side. With `serialize` set, every request and response goes through the
// wire codec and size limits as over a real network, which lets the
// conformance suite check the codec without sockets.
//
// A call to an address nobody serves (never started, or stopped: a dead task)
// fails with Unavailable naming the task. Thread-safe.
#ifndef SHOAL_TRANSPORT_INPROC_INPROC_TRANSPORT_H_
#define SHOAL_TRANSPORT_INPROC_INPROC_TRANSPORT_H_

#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>

#include "shoal/transport/transport.h"

namespace shoal {

class InProcNetwork {
 public:
  // A served address: calls hold `in_use` shared while they run, so stopping
  // a server waits for its calls to finish before the service may go away.
  struct Endpoint {
    VariableService* service;
    std::shared_mutex in_use;
  };

  absl::Status Register(const std::string& address, std::shared_ptr<Endpoint> endpoint);
  void Unregister(const std::string& address);
  std::shared_ptr<Endpoint> Find(const std::string& address) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Endpoint>> endpoints_;
};

struct InProcOptions {
  bool serialize = false;                     // go through the wire codec
  size_t max_message_bytes = 512ull << 20;    // enforced when serializing
};

class InProcTransport final : public Transport {
 public:
  // `network` is not owned and must outlive the transport and its channels.
  explicit InProcTransport(InProcNetwork* network, InProcOptions options = {})
      : network_(network), options_(options) {}

  absl::StatusOr<std::unique_ptr<ServerHandle>> Serve(const std::string& address,
                                                      VariableService* service) override;
  absl::StatusOr<std::shared_ptr<Channel>> Connect(const TaskId& task, const std::string& address) override;

 private:
  InProcNetwork* network_;
  InProcOptions options_;
};

}  // namespace shoal

#endif  // SHOAL_TRANSPORT_INPROC_INPROC_TRANSPORT_H_
