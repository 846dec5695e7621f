#include "shoal/transport/inproc/inproc_transport.h"

#include "absl/strings/str_cat.h"
#include "shoal/core/codec.h"
#include "shoal/core/status.h"
#include "shoal/server/variable_service.h"
#include "shoal/transport/blocking_executor.h"

namespace shoal {
namespace {

class InProcServerHandle final : public ServerHandle {
 public:
  InProcServerHandle(InProcNetwork* network, std::string address, std::shared_ptr<InProcNetwork::Endpoint> endpoint)
      : network_(network), address_(std::move(address)), endpoint_(std::move(endpoint)) {}
  ~InProcServerHandle() override {
    network_->Unregister(address_);
    std::unique_lock wait_for_calls(endpoint_->in_use);
  }
  std::string address() const override { return address_; }

 private:
  InProcNetwork* network_;
  std::string address_;
  std::shared_ptr<InProcNetwork::Endpoint> endpoint_;
};

// Encodes `message` and decodes it again, as a network would.
template <typename Message, typename Encode, typename Decode>
absl::Status RoundTrip(const Message& in, Message* out, size_t max_bytes, Encode encode, Decode decode) {
  SHOAL_ASSIGN_OR_RETURN(EncodedMessage encoded, encode(in));
  std::string bytes = encoded.Flatten();
  absl::string_view chunk = bytes;
  return decode(absl::MakeConstSpan(&chunk, 1), max_bytes, out, {});
}

class InProcChannel final : public Channel {
 public:
  InProcChannel(TaskId task, std::string address, InProcNetwork* network, InProcOptions options)
      : Channel(std::move(task)), address_(std::move(address)), network_(network), options_(options) {}

  void Call(const Request& request, Response* response, absl::Time deadline,
            std::function<void(absl::Status)> done) override {
    // A save, restore or table creation (long, never a wait) runs on a
    // thread of its own, as it would over a network, so that one client's
    // calls to several tasks overlap: every ps task writes its shard at once.
    if (VariableService::TakesLong(request) && !VariableService::MayWait(request) &&
        BlockingExecutor::Shared()->TrySubmit(
            [this, &request, response, deadline, done] { done(CallNow(request, response, deadline)); })) {
      return;
    }
    done(CallNow(request, response, deadline));
  }

 private:
  absl::Status CallNow(const Request& request, Response* response, absl::Time deadline) {
    const std::string where = absl::StrCat(task().ToString(), " at ", address_);
    if (absl::Now() > deadline) return absl::DeadlineExceededError(absl::StrCat(where, ": deadline passed before the call"));
    std::shared_ptr<InProcNetwork::Endpoint> endpoint = network_->Find(address_);
    if (endpoint == nullptr) return absl::UnavailableError(absl::StrCat(where, " is not serving (down or not started)"));
    std::shared_lock in_use(endpoint->in_use);
    if (!options_.serialize) {
      endpoint->service->Handle(request, response);
      return ResponseStatus(response->header);
    }
    Request received;
    absl::Status status = RoundTrip(request, &received, options_.max_message_bytes, EncodeRequest, DecodeRequest);
    if (!status.ok()) return Annotate(status, absl::StrCat("sending to ", where));
    Response answer;
    endpoint->service->Handle(received, &answer);
    status = RoundTrip(answer, response, SIZE_MAX, EncodeResponse, DecodeResponse);
    if (!status.ok()) return Annotate(status, absl::StrCat("answer from ", where));
    return ResponseStatus(response->header);
  }

  std::string address_;
  InProcNetwork* network_;
  InProcOptions options_;
};

}  // namespace

absl::Status InProcNetwork::Register(const std::string& address, std::shared_ptr<Endpoint> endpoint) {
  std::lock_guard lock(mu_);
  if (!endpoints_.emplace(address, std::move(endpoint)).second) {
    return absl::AlreadyExistsError(absl::StrCat("address '", address, "' is already served in this process"));
  }
  return absl::OkStatus();
}

void InProcNetwork::Unregister(const std::string& address) {
  std::lock_guard lock(mu_);
  endpoints_.erase(address);
}

std::shared_ptr<InProcNetwork::Endpoint> InProcNetwork::Find(const std::string& address) const {
  std::lock_guard lock(mu_);
  auto it = endpoints_.find(address);
  return it == endpoints_.end() ? nullptr : it->second;
}

absl::StatusOr<std::unique_ptr<ServerHandle>> InProcTransport::Serve(const std::string& address,
                                                                     VariableService* service) {
  auto endpoint = std::make_shared<InProcNetwork::Endpoint>();
  endpoint->service = service;
  SHOAL_RETURN_IF_ERROR(network_->Register(address, endpoint));
  return std::unique_ptr<ServerHandle>(new InProcServerHandle(network_, address, std::move(endpoint)));
}

absl::StatusOr<std::shared_ptr<Channel>> InProcTransport::Connect(const TaskId& task, const std::string& address) {
  return std::shared_ptr<Channel>(new InProcChannel(task, address, network_, options_));
}

}  // namespace shoal
