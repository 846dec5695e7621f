#include "shoal/transport/grpc/grpc_transport.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "shoal/core/codec.h"
#include "shoal/core/constant_time.h"
#include "shoal/core/status.h"
#include "shoal/transport/grpc/grpc_tuning.h"

namespace shoal {
namespace {

constexpr char kMethod[] = "/shoal.VariableService/Call";
constexpr size_t kHeaderSlack = 16 << 20;  // room for headers beyond the tensor payload

int MessageLimit(size_t max_tensor_bytes) {
  size_t limit = max_tensor_bytes + kHeaderSlack;
  return limit > static_cast<size_t>(INT32_MAX) ? INT32_MAX : static_cast<int>(limit);
}

// Bulk tensors: the largest frames HTTP/2 allows, a flow-control lookahead
// that lets a 16 MiB message go without waiting for window updates, and
// socket reads that may grow to 16 MB. They start at 1 MB: each connection
// keeps its read buffer, and starting at 4 MB held 12-17 MB more per ps
// task for no measured speed; applied through `set_int` to channels and
// servers.
template <typename SetInt>
void SetBulkTransferArguments(SetInt set_int) {
  set_int(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (1 << 24) - 1);
  set_int(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  set_int(GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, 8 << 20);
  set_int(GRPC_ARG_TCP_READ_CHUNK_SIZE, 1 << 20);
  set_int(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 256 << 10);
  set_int(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 16 << 20);
}

void DestroyTensorRef(void* tensor) { delete static_cast<torch::Tensor*>(tensor); }

// Builds the byte buffer to send: the header frame, then one slice per
// tensor pointing at the tensor's memory, which the slice keeps alive.
grpc::ByteBuffer ToByteBuffer(EncodedMessage encoded) {
  std::vector<grpc::Slice> slices;
  slices.reserve(1 + encoded.bodies.size());
  slices.emplace_back(encoded.header_frame);
  for (torch::Tensor& body : encoded.bodies) {
    size_t bytes = body.nbytes();
    if (bytes == 0) continue;
    void* data = body.data_ptr();
    slices.emplace_back(data, bytes, &DestroyTensorRef, new torch::Tensor(std::move(body)));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// The received bytes as chunk views, each with an owner (a reference to its
// slice) so that decoded tensors can point into the slices instead of copying.
struct ReceivedChunks {
  std::vector<absl::string_view> views;
  std::vector<ChunkOwner> owners;
};

absl::Status Chunks(const grpc::ByteBuffer& buffer, ReceivedChunks* out) {
  std::vector<grpc::Slice> slices;
  grpc::Status dumped = buffer.Dump(&slices);
  if (!dumped.ok()) return absl::DataLossError("cannot read the received message");
  for (grpc::Slice& s : slices) {
    // View the slice only once it has its final home: a small slice keeps its
    // bytes inline, inside the grpc::Slice object itself.
    auto owner = std::make_shared<const grpc::Slice>(std::move(s));
    out->views.emplace_back(reinterpret_cast<const char*>(owner->begin()), owner->size());
    out->owners.push_back(std::move(owner));
  }
  return absl::OkStatus();
}

// Serves one call: decode, hand to the service, encode the answer.
class CallReactor final : public grpc::ServerGenericBidiReactor {
 public:
  CallReactor(VariableService* service, size_t max_bytes, std::shared_ptr<BlockingExecutor> executor,
              std::string peer)
      : service_(service), max_bytes_(max_bytes), executor_(std::move(executor)), peer_(std::move(peer)) {
    StartRead(&request_buffer_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request message"));
      return;
    }
    auto request = std::make_shared<Request>();
    request->peer = peer_;
    ReceivedChunks chunks;
    absl::Status status = Chunks(request_buffer_, &chunks);
    if (status.ok()) status = DecodeRequest(chunks.views, max_bytes_ + kHeaderSlack, request.get(), chunks.owners);
    if (status.ok() && VariableService::TakesLong(*request)) {
      // gRPC's callback threads are few (about one per core): a long poll
      // holding one could starve the very call that ends its wait, and a
      // save holding one stalls the pushes behind it.
      const bool queued = executor_->TrySubmit([this, request] {
        Response response;
        service_->Handle(*request, &response);
        Send(std::move(response));
      });
      if (!queued) {
        Answer(absl::ResourceExhaustedError(absl::StrCat(
                   "already serving ", executor_->max_pending(),
                   " calls that wait or take long (the most at once); try again")),
               *request);
      }
      return;
    }
    Answer(status, *request);
  }

  void OnDone() override { delete this; }

 private:
  // Serves a decoded request (or reports why it could not be decoded) and
  // sends the response, ending the call.
  void Answer(absl::Status decoded, const Request& request) {
    Response response;
    if (decoded.ok()) {
      service_->Handle(request, &response);
    } else {
      // A garbled or refused request is answered, and the server goes on serving.
      decoded = Annotate(decoded, absl::StrCat("request to ", service_->options().task_name));
      response.header.set_status_code(static_cast<int>(decoded.code()));
      response.header.set_status_message(std::string(decoded.message()));
    }
    Send(std::move(response));
  }

  // Encodes `response` and sends it, ending the call.
  void Send(Response response) {
    auto encoded = EncodeResponse(response);
    if (!encoded.ok()) {
      Finish(grpc::Status(grpc::StatusCode::INTERNAL, std::string(encoded.status().message())));
      return;
    }
    response_buffer_ = ToByteBuffer(*std::move(encoded));
    StartWriteAndFinish(&response_buffer_, grpc::WriteOptions(), grpc::Status::OK);
  }

  VariableService* service_;
  size_t max_bytes_;
  std::shared_ptr<BlockingExecutor> executor_;
  const std::string peer_;
  grpc::ByteBuffer request_buffer_, response_buffer_;
};

// Refuses a call without reading it: an unknown method, a missing token.
class RefusingReactor final : public grpc::ServerGenericBidiReactor {
 public:
  explicit RefusingReactor(grpc::Status status) { Finish(status); }
  void OnDone() override { delete this; }
};

// The token's metadata key (lower case, as HTTP/2 requires).
constexpr char kTokenKey[] = "shoal-token";

class GenericService final : public grpc::CallbackGenericService {
 public:
  GenericService(VariableService* service, size_t max_bytes, std::string token,
                 std::shared_ptr<BlockingExecutor> executor)
      : service_(service),
        max_bytes_(max_bytes),
        token_(std::move(token)),
        executor_(executor ? std::move(executor) : BlockingExecutor::Shared()) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    if (!token_.empty()) {
      const auto& metadata = context->client_metadata();
      auto sent = metadata.find(kTokenKey);
      const absl::string_view given =
          sent == metadata.end() ? absl::string_view() : absl::string_view(sent->second.data(), sent->second.size());
      if (sent == metadata.end() || !ConstantTimeEquals(given, token_)) {
        return new RefusingReactor(grpc::Status(
            grpc::StatusCode::UNAUTHENTICATED,
            absl::StrCat(service_->options().task_name, " refused a call with ",
                         sent == metadata.end() ? "no token" : "a wrong token")));
      }
    }
    if (context->method() != kMethod) {
      return new RefusingReactor(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "unknown method " + context->method()));
    }
    return new CallReactor(service_, max_bytes_, executor_, context->peer());
  }

 private:
  VariableService* service_;
  size_t max_bytes_;
  std::string token_;
  std::shared_ptr<BlockingExecutor> executor_;
};

// Reads a PEM file named in the TLS options.
absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& what) {
  if (path.empty()) return std::string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("TLS ", what, " '", path, "' cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const GrpcTlsOptions& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError("TLS: a server needs a certificate and its key (tls cert_file, key_file)");
  }
  grpc::SslServerCredentialsOptions options(
      tls.mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  SHOAL_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem(tls.ca_file, "CA file"));
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  SHOAL_ASSIGN_OR_RETURN(pair.private_key, ReadPem(tls.key_file, "key file"));
  SHOAL_ASSIGN_OR_RETURN(pair.cert_chain, ReadPem(tls.cert_file, "certificate file"));
  options.pem_key_cert_pairs.push_back(pair);
  if (tls.mutual && options.pem_root_certs.empty()) {
    return absl::InvalidArgumentError("TLS: mutual TLS needs a CA file to verify clients with");
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const GrpcTlsOptions& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  SHOAL_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem(tls.ca_file, "CA file"));
  if (tls.mutual) {
    SHOAL_ASSIGN_OR_RETURN(options.pem_private_key, ReadPem(tls.key_file, "key file"));
    SHOAL_ASSIGN_OR_RETURN(options.pem_cert_chain, ReadPem(tls.cert_file, "certificate file"));
  }
  return grpc::SslCredentials(options);
}

class GrpcServerHandle final : public ServerHandle {
 public:
  GrpcServerHandle(std::unique_ptr<GenericService> service, std::unique_ptr<grpc::Server> server, std::string address)
      : service_(std::move(service)), server_(std::move(server)), address_(std::move(address)) {}
  ~GrpcServerHandle() override {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_->Wait();
  }
  std::string address() const override { return address_; }

 private:
  std::unique_ptr<GenericService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& where) {
  auto code = static_cast<absl::StatusCode>(status.error_code());  // the codes are the same numbers
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::UnavailableError(absl::StrCat(where, " is unavailable: ", status.error_message()));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(absl::StrCat(where, " did not answer before the deadline"));
    default:
      return absl::Status(code, absl::StrCat(where, ": ", status.error_message()));
  }
}

class GrpcChannel final : public Channel {
 public:
  GrpcChannel(TaskId task, std::string address, const GrpcOptions& options,
              std::shared_ptr<grpc::ChannelCredentials> credentials)
      : Channel(std::move(task)), address_(std::move(address)), where_(absl::StrCat(this->task().ToString(), " at ", address_)),
        max_bytes_(options.max_message_bytes), token_(options.token) {
    for (int i = 0; i < std::max(1, options.connections_per_peer); ++i) {
      const grpc::ChannelArguments args = PeerChannelArguments(i, MessageLimit(max_bytes_));
      channels_.push_back(grpc::CreateCustomChannel(address_, credentials, args));
      stubs_.push_back(std::make_unique<grpc::GenericStub>(channels_.back()));
    }
  }

  void Call(const Request& request, Response* response, absl::Time deadline,
            std::function<void(absl::Status)> done) override {
    auto encoded = EncodeRequest(request);
    if (!encoded.ok()) {
      done(Annotate(encoded.status(), absl::StrCat("sending to ", where_)));
      return;
    }
    if (encoded->total_bytes > max_bytes_ + kHeaderSlack || TensorBytes(request.tensors) > max_bytes_) {
      done(absl::ResourceExhaustedError(absl::StrCat("message of ", encoded->total_bytes, " bytes to ", where_,
                                                     " exceeds the limit of ", max_bytes_, " bytes")));
      return;
    }
    auto* state = new CallState{};
    state->response = response;
    state->done = std::move(done);
    state->request_buffer = ToByteBuffer(*std::move(encoded));
    state->context.set_deadline(absl::ToChronoTime(deadline));
    if (!token_.empty()) state->context.AddMetadata(kTokenKey, token_);
    PickStub().UnaryCall(&state->context, kMethod, grpc::StubOptions(), &state->request_buffer, &state->response_buffer,
                   [this, state](grpc::Status status) {
                     absl::Status result = Finish(status, state);
                     auto done = std::move(state->done);
                     delete state;
                     done(std::move(result));
                   });
  }

 private:
  struct CallState {
    grpc::ClientContext context;
    grpc::ByteBuffer request_buffer, response_buffer;
    Response* response;
    std::function<void(absl::Status)> done;
  };

  // The next connection in turn that is up. A connection whose first
  // attempt failed (its peer was not listening yet) fails calls fast until
  // its reconnect backoff ends, while another may already be up: prefer
  // that one, and nudge the others to reconnect.
  grpc::GenericStub& PickStub() {
    const size_t first = next_stub_.fetch_add(1, std::memory_order_relaxed);
    for (size_t i = 0; i < stubs_.size(); ++i) {
      const size_t j = (first + i) % stubs_.size();
      if (channels_[j]->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) return *stubs_[j];
    }
    return *stubs_[first % stubs_.size()];
  }

  absl::Status Finish(const grpc::Status& status, CallState* state) {
    if (!status.ok()) return FromGrpcStatus(status, where_);
    ReceivedChunks chunks;
    SHOAL_RETURN_IF_ERROR(Chunks(state->response_buffer, &chunks));
    absl::Status decoded = DecodeResponse(chunks.views, SIZE_MAX, state->response, chunks.owners);
    if (!decoded.ok()) return Annotate(decoded, absl::StrCat("answer from ", where_));
    return ResponseStatus(state->response->header);
  }

  std::string address_;
  std::string where_;
  size_t max_bytes_;
  std::string token_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
  std::atomic<size_t> next_stub_{0};
};

}  // namespace

grpc::ChannelArguments PeerChannelArguments(int index, int message_limit) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(message_limit);
  args.SetMaxSendMessageSize(message_limit);
  // A distinct argument and a private subchannel pool give each connection
  // index its own TCP connection.
  args.SetInt("shoal.connection_index", index);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Reconnect soon after a refused attempt (a task restarting). The
  // "minimum" backoff is also how long one attempt may take to finish TCP
  // and the HTTP/2 handshake: keep gRPC's 20 s, so that a slow peer is
  // reached, not given up on after 100 ms.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  SetBulkTransferArguments([&](const char* key, int value) { args.SetInt(key, value); });
  return args;
}

void ConfigureServer(grpc::ServerBuilder& builder, int message_limit) {
  // Linux would let a second server share the port (SO_REUSEPORT) and split
  // the traffic between two tasks; a busy address must be an error instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(message_limit);
  builder.SetMaxSendMessageSize(message_limit);
  SetBulkTransferArguments([&](const char* key, int value) { builder.AddChannelArgument(key, value); });
}

void KeepLargeAllocationsMapped() {
  mallopt(M_MMAP_THRESHOLD, 512 << 20);
  mallopt(M_TRIM_THRESHOLD, 1024 << 20);
}

absl::StatusOr<std::unique_ptr<ServerHandle>> GrpcTransport::Serve(const std::string& address,
                                                                   VariableService* service) {
  auto generic = std::make_unique<GenericService>(service, options_.max_message_bytes, options_.token,
                                                  options_.executor);
  auto credentials = ServerCredentials(options_.tls);
  if (!credentials.ok()) return Annotate(credentials.status(), service->options().task_name);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, *credentials, &port);
  ConfigureServer(builder, MessageLimit(options_.max_message_bytes));
  builder.RegisterCallbackGenericService(generic.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve ", service->options().task_name, " at '", address,
                                               "' (address in use or invalid?)"));
  }
  std::string host = address.substr(0, address.rfind(':'));
  return std::unique_ptr<ServerHandle>(
      new GrpcServerHandle(std::move(generic), std::move(server), absl::StrCat(host, ":", port)));
}

absl::StatusOr<std::shared_ptr<Channel>> GrpcTransport::Connect(const TaskId& task, const std::string& address) {
  SHOAL_ASSIGN_OR_RETURN(auto credentials, ChannelCredentials(options_.tls));
  return std::shared_ptr<Channel>(new GrpcChannel(task, address, options_, std::move(credentials)));
}

}  // namespace shoal
