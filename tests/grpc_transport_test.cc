// gRPC-specific failures: what the conformance suite cannot express without
// reaching below the transport (raw bytes, a peer that never answers).
#include "shoal/transport/grpc/grpc_transport.h"

#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "absl/synchronization/notification.h"
#include "shoal/core/codec.h"
#include "shoal/core/status.h"
#include "shoal/session/local_cluster.h"
#include "tcp_proxy.h"
#include "source_paths.h"

namespace shoal {
namespace {

Request LookupRequest() {
  Request request;
  request.header.mutable_lookup()->add_names("x");
  return request;
}

// Calls `method` on `address` with raw bytes, below shoal's transport.
grpc::Status RawCall(const std::string& address, const std::string& method, const std::string& bytes,
                     grpc::ByteBuffer* reply) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  absl::Notification done;
  grpc::Status rpc_status;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, reply, [&](grpc::Status s) {
    rpc_status = s;
    done.Notify();
  });
  done.WaitForNotification();
  return rpc_status;
}

TEST(GrpcTransportTest, UnreachableAddressIsUnavailableWithinTheDeadline) {
  GrpcTransport transport;
  auto channel = transport.Connect({"ps", 3}, "127.0.0.1:1").value();
  Response response;
  const absl::Time start = absl::Now();
  absl::Status status = CallAndWait(*channel, LookupRequest(), &response, absl::Now() + absl::Seconds(2));
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  EXPECT_TRUE(absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) << status;
  EXPECT_NE(status.message().find("/job:ps/task:3 at 127.0.0.1:1"), std::string::npos) << status;
}

TEST(GrpcTransportTest, APeerThatNeverAnswersIsDeadlineExceededNamingTheTask) {
  // A socket that listens (the kernel completes the handshake) but never speaks.
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

  GrpcTransport transport;
  auto channel = transport.Connect({"ps", 1}, address).value();
  Response response;
  const absl::Time start = absl::Now();
  absl::Status status = CallAndWait(*channel, LookupRequest(), &response, absl::Now() + absl::Seconds(1));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status)) << status;
  EXPECT_NE(status.message().find("/job:ps/task:1"), std::string::npos) << status;
  close(listener);
}

// A connection attempt has long enough for TCP and the HTTP/2 handshake
// over a slow link (it had 100 ms, gRPC's reconnect backoff): the first call
// to a peer whose answers arrive 300 ms late succeeds, with no retry.
TEST(GrpcTransportTest, TheFirstCallToAPeerBehindASlowLinkSucceeds) {
  GrpcTransport transport;
  VariableService service(VariableServiceOptions{"/job:ps/task:0"});
  auto server = transport.Serve("127.0.0.1:0", &service).value();
  const std::string& address = server->address();
  const int proxy_port = FreeLoopbackPorts(1).value()[0];
  TcpProxy slow(proxy_port, std::stoi(address.substr(address.rfind(':') + 1)), absl::Milliseconds(300));
  ASSERT_TRUE(slow.ok());
  auto channel = transport.Connect({"ps", 0}, "127.0.0.1:" + std::to_string(proxy_port)).value();
  Response response;
  absl::Status status = CallAndWait(*channel, LookupRequest(), &response, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(status.ok()) << status;
}

TEST(GrpcTransportTest, GarbledBytesAreAnsweredAsDataLossAndTheServerKeepsServing) {
  GrpcTransport transport;
  VariableService service(VariableServiceOptions{"/job:ps/task:0"});
  auto server = transport.Serve("127.0.0.1:0", &service).value();

  const std::string garbage = "\x05\x00\x00\x00not a protobuf header at all";
  grpc::ByteBuffer reply;
  grpc::Status rpc_status = RawCall(server->address(), "/shoal.VariableService/Call", garbage, &reply);
  ASSERT_TRUE(rpc_status.ok()) << rpc_status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(reply.Dump(&slices).ok());
  std::vector<absl::string_view> chunks;
  for (const auto& s : slices) chunks.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
  Response decoded;
  ASSERT_TRUE(DecodeResponse(chunks, SIZE_MAX, &decoded).ok());
  absl::Status verdict = ResponseStatus(decoded.header);
  EXPECT_EQ(verdict.code(), absl::StatusCode::kDataLoss) << verdict;
  EXPECT_NE(verdict.message().find("/job:ps/task:0"), std::string::npos) << verdict;

  // A well-formed call still works.
  auto good = transport.Connect({"ps", 0}, server->address()).value();
  Response response;
  EXPECT_TRUE(CallAndWait(*good, LookupRequest(), &response, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_FALSE(response.header.lookup().present(0));
}

// Answers what a server said to raw bytes, decoded.
absl::Status RawVerdict(const std::string& address, const std::string& bytes) {
  grpc::ByteBuffer reply;
  grpc::Status rpc_status = RawCall(address, "/shoal.VariableService/Call", bytes, &reply);
  if (!rpc_status.ok()) return absl::UnknownError(rpc_status.error_message());
  std::vector<grpc::Slice> slices;
  if (!reply.Dump(&slices).ok()) return absl::UnknownError("reply does not dump");
  std::vector<absl::string_view> chunks;
  for (const auto& s : slices) chunks.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
  Response decoded;
  SHOAL_RETURN_IF_ERROR(DecodeResponse(chunks, SIZE_MAX, &decoded));
  return ResponseStatus(decoded.header);
}

std::string FrameOf(const wire::RequestHeader& header) {
  const std::string serialized = header.SerializeAsString();
  std::string bytes(4, '\0');
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>(serialized.size() >> (8 * i));
  return bytes + serialized;
}

TEST(GrpcTransportTest, RequestsListingTooManyTensorsOrNamesAreRefusedAndTheServerKeepsServing) {
  GrpcTransport transport;
  VariableService service(VariableServiceOptions{"/job:ps/task:0"});
  auto server = transport.Serve("127.0.0.1:0", &service).value();

  wire::RequestHeader empty_tensors;  // 400,000 tensors of shape [0]: 2.8 MB
  empty_tensors.mutable_assign()->add_names("x");
  for (int i = 0; i < 400000; ++i) {
    empty_tensors.add_tensors()->add_shape(0);
  }
  absl::Status verdict = RawVerdict(server->address(), FrameOf(empty_tensors));
  EXPECT_EQ(verdict.code(), absl::StatusCode::kResourceExhausted) << verdict;
  EXPECT_NE(verdict.message().find("/job:ps/task:0"), std::string::npos) << verdict;

  wire::RequestHeader many_names;  // a lookup of 100,000 names: each would be answered with a definition
  for (int i = 0; i < 100000; ++i) many_names.mutable_lookup()->add_names("n");
  verdict = RawVerdict(server->address(), FrameOf(many_names));
  EXPECT_EQ(verdict.code(), absl::StatusCode::kResourceExhausted) << verdict;
  EXPECT_NE(verdict.message().find("lookup request to /job:ps/task:0 lists 100000 names"), std::string::npos)
      << verdict;

  auto good = transport.Connect({"ps", 0}, server->address()).value();
  Response response;
  EXPECT_TRUE(CallAndWait(*good, LookupRequest(), &response, absl::Now() + absl::Seconds(5)).ok());
}

// Stress on the concurrent receive path. transport_bench once found a
// use-after-free there (slices viewed before being moved into their owners,
// while a small slice keeps its bytes inside the grpc::Slice object itself:
// "variable '' not found"); this checks many mixed-size calls stay intact.
TEST(GrpcTransportTest, ConcurrentMixedSizeCallsKeepTheirBytes) {
  GrpcTransport transport;
  VariableService service(VariableServiceOptions{"/job:ps/task:0"});
  auto server = transport.Serve("127.0.0.1:0", &service).value();
  wire::VariableDef small, big;
  small.set_name("small");
  small.add_shape(3);
  big.set_name("big");
  big.add_shape(16384);
  ASSERT_TRUE(service.store().Create({small, big}, {torch::zeros({3}), torch::zeros({16384})}).ok());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto channel = transport.Connect({"ps", 0}, server->address()).value();
      for (int i = 0; i < 150; ++i) {
        Request read;
        read.header.mutable_read()->add_names(i % 2 ? "small" : "big");
        read.header.mutable_read()->add_names("small");
        Response response;
        absl::Status status = CallAndWait(*channel, read, &response, absl::Now() + absl::Seconds(10));
        if (!status.ok() || response.tensors.size() != 2 || response.tensors[1].numel() != 3) {
          ADD_FAILURE() << "thread " << t << " call " << i << ": " << status;
          if (++failures > 3) return;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(GrpcTransportTest, UnknownMethodIsUnimplemented) {
  GrpcTransport transport;
  VariableService service(VariableServiceOptions{"/job:ps/task:0"});
  auto server = transport.Serve("127.0.0.1:0", &service).value();
  grpc::ByteBuffer reply;
  grpc::Status rpc_status = RawCall(server->address(), "/other.Service/Call", "x", &reply);
  EXPECT_EQ(rpc_status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

TEST(GrpcTransportTest, BusyAddressIsAClearError) {
  GrpcTransport transport;
  VariableService a(VariableServiceOptions{"/job:ps/task:0"}), b(VariableServiceOptions{"/job:ps/task:1"});
  auto first = transport.Serve("127.0.0.1:0", &a).value();
  auto second = transport.Serve(first->address(), &b);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("/job:ps/task:1"), std::string::npos) << second.status();
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

// The attack: thousands of concurrent long polls, each once holding a thread
// of its own. Waiting calls are bounded; the excess is refused at once.
TEST(GrpcTransportTest, AFloodOfLongPollsIsBoundedAndTheRestIsRefusedAtOnce) {
  GrpcOptions options;
  options.executor = std::make_shared<BlockingExecutor>(4, 4);
  GrpcTransport transport(options);
  VariableService service(VariableServiceOptions{"/job:ps/task:0"});
  auto server = transport.Serve("127.0.0.1:0", &service).value();
  auto channel = transport.Connect({"ps", 0}, server->address()).value();
  Request poll;  // waits 200 ms for a counter that never gets there
  poll.header.mutable_counter()->mutable_counter()->set_name("never");
  poll.header.mutable_counter()->set_wait_until_at_least(1);
  poll.header.mutable_counter()->set_wait_ms(200);
  std::atomic<int> served{0}, refused{0}, other{0};
  std::string refusal;
  std::mutex mu;
  std::vector<std::thread> flood;
  const absl::Time until = absl::Now() + absl::Seconds(1);
  for (int i = 0; i < 16; ++i) {
    flood.emplace_back([&] {
      while (absl::Now() < until) {
        Response response;
        absl::Status status = CallAndWait(*channel, poll, &response, absl::Now() + absl::Seconds(10));
        if (status.ok()) {
          ++served;
        } else if (absl::IsResourceExhausted(status)) {
          ++refused;
          std::lock_guard lock(mu);
          refusal = std::string(status.message());
        } else {
          ++other;
        }
      }
    });
  }
  // Calls that do not wait are still served during the flood.
  Response lookup;
  EXPECT_TRUE(CallAndWait(*channel, LookupRequest(), &lookup, absl::Now() + absl::Seconds(5)).ok());
  for (auto& t : flood) t.join();
  EXPECT_GT(served.load(), 0);
  EXPECT_GT(refused.load(), 0);
  EXPECT_EQ(other.load(), 0);
  EXPECT_NE(refusal.find("/job:ps/task:0"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("already serving 4 calls that wait or take long"), std::string::npos) << refusal;
  // Four in flight at most: each served one held its place for 200 ms.
  EXPECT_LE(served.load(), 4 * (1000 / 200 + 2));
  Response after;  // the places are free again
  EXPECT_TRUE(CallAndWait(*channel, poll, &after, absl::Now() + absl::Seconds(5)).ok());
}

// Long polls must not hold the few threads that serve calls: the call that
// ends their wait has to get through while they wait.
TEST(GrpcTransportTest, ManyLongPollsDoNotStarveTheCallThatEndsThem) {
  GrpcTransport transport;
  VariableService service(VariableServiceOptions{"/job:ps/task:0"});
  auto server = transport.Serve("127.0.0.1:0", &service).value();
  auto channel = transport.Connect({"ps", 0}, server->address()).value();
  auto counter_request = [](int64_t delta, int64_t wait_ms) {
    Request request;
    auto* counter = request.header.mutable_counter();
    counter->mutable_counter()->set_name("step");
    counter->mutable_counter()->set_delta(delta);
    counter->set_wait_until_at_least(1);
    counter->set_wait_ms(wait_ms);
    return request;
  };
  constexpr int kPolls = 8;
  std::vector<int64_t> seen(kPolls, -1);
  std::vector<std::thread> polls;
  for (int i = 0; i < kPolls; ++i) {
    polls.emplace_back([&, i] {
      Response response;
      // The server caps a wait at 200 ms; the step comes well within that.
      absl::Status status =
          CallAndWait(*channel, counter_request(0, 200), &response, absl::Now() + absl::Seconds(10));
      if (status.ok()) seen[i] = response.header.counter().value();
    });
  }
  absl::SleepFor(absl::Milliseconds(30));  // the polls are waiting now
  Response response;
  ASSERT_TRUE(CallAndWait(*channel, counter_request(1, 0), &response, absl::Now() + absl::Seconds(10)).ok());
  for (auto& poll : polls) poll.join();
  for (int i = 0; i < kPolls; ++i) EXPECT_EQ(seen[i], 1) << "poll " << i << " timed out before the step came";
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

// A create request for variable "secret_test" [2].
Request CreateRequest() {
  Request request;
  auto* def = request.header.mutable_create_variables()->add_variables();
  def->set_name("secret_test");
  def->add_shape(2);
  def->mutable_optimizer()->set_kind("sgd");
  request.tensors.push_back(torch::zeros({2}));
  return request;
}

// A ps task served over gRPC with `options`.
struct SecuredServer {
  explicit SecuredServer(const GrpcOptions& options)
      : transport(options), service(VariableServiceOptions{"/job:ps/task:0"}),
        server(transport.Serve("127.0.0.1:0", &service).value()) {}
  GrpcTransport transport;
  VariableService service;
  std::unique_ptr<ServerHandle> server;
};

absl::Status CallWith(const GrpcOptions& options, const std::string& address, const Request& request) {
  GrpcTransport transport(options);
  auto channel = transport.Connect({"ps", 0}, address);
  if (!channel.ok()) return channel.status();
  Response response;
  return CallAndWait(**channel, request, &response, absl::Now() + absl::Seconds(5));
}

TEST(GrpcSecurityTest, ACallWithoutTheTokenIsUnauthenticatedAndChangesNothing) {
  GrpcOptions server_options;
  server_options.token = "s3cret-token";
  SecuredServer secured(server_options);
  auto& server = secured.server;
  VariableService& service = secured.service;

  GrpcOptions none, wrong, right;
  wrong.token = "s3cret-tokem";
  right.token = "s3cret-token";
  for (const auto& [options, what] : {std::pair{none, "no token"}, std::pair{wrong, "a wrong token"}}) {
    absl::Status status = CallWith(options, server->address(), CreateRequest());
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
    EXPECT_NE(status.message().find("/job:ps/task:0 refused a call with " + std::string(what)), std::string::npos)
        << status;
    EXPECT_FALSE(service.store().Lookup({"secret_test"})[0].present);  // no handler ran
  }
  EXPECT_TRUE(CallWith(right, server->address(), CreateRequest()).ok());
  EXPECT_TRUE(service.store().Lookup({"secret_test"})[0].present);
}

// `shutdown` is taken only from the job's own tasks: the server asks who the
// caller is (the peer address gRPC saw) and refuses a stranger.
TEST(GrpcSecurityTest, AShutdownFromOutsideTheJobIsRefused) {
  std::string seen_peer;
  VariableServiceOptions options{"/job:ps/task:0"};
  options.is_job_peer = [&](const std::string& peer) {
    seen_peer = peer;
    return false;
  };
  VariableService service(options);
  GrpcTransport transport;
  auto server = transport.Serve("127.0.0.1:0", &service).value();
  auto channel = transport.Connect({"ps", 0}, server->address()).value();
  Request shutdown;
  shutdown.header.mutable_shutdown();
  Response response;
  absl::Status status = CallAndWait(*channel, shutdown, &response, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_NE(status.message().find("not a host of this job's tasks"), std::string::npos) << status;
  EXPECT_EQ(seen_peer.rfind("ipv4:127.0.0.1:", 0), 0u) << seen_peer;
  EXPECT_FALSE(service.shutdown_requested().HasBeenNotified());
}

GrpcTlsOptions Tls(const std::string& ca, const std::string& cert, bool mutual) {
  const std::string dir = std::string(SHOAL_SOURCE_DIR) + "/tests/data/tls/";
  GrpcTlsOptions tls;
  tls.ca_file = ca.empty() ? "" : dir + ca + ".pem";
  if (!cert.empty()) {
    tls.cert_file = dir + cert + ".pem";
    tls.key_file = dir + cert + ".key";
  }
  tls.mutual = mutual;
  return tls;
}

TEST(GrpcSecurityTest, TlsServesOnlyClientsThatSpeakIt) {
  GrpcOptions server_options;
  server_options.tls = Tls("ca", "server", /*mutual=*/false);
  SecuredServer secured(server_options);
  auto& server = secured.server;

  GrpcOptions tls_client;
  tls_client.tls = Tls("ca", "", false);
  EXPECT_TRUE(CallWith(tls_client, server->address(), LookupRequest()).ok());
  GrpcOptions plain;  // no TLS: the handshake fails
  EXPECT_EQ(CallWith(plain, server->address(), LookupRequest()).code(), absl::StatusCode::kUnavailable);
  GrpcOptions stranger;  // a CA that did not sign the server's certificate
  stranger.tls = Tls("stranger_ca", "", false);
  EXPECT_EQ(CallWith(stranger, server->address(), LookupRequest()).code(), absl::StatusCode::kUnavailable);
}

TEST(GrpcSecurityTest, MutualTlsRequiresAClientCertificateFromTheCa) {
  GrpcOptions server_options;
  server_options.tls = Tls("ca", "server", /*mutual=*/true);
  SecuredServer secured(server_options);
  auto& server = secured.server;

  GrpcOptions client;
  client.tls = Tls("ca", "client", true);
  EXPECT_TRUE(CallWith(client, server->address(), LookupRequest()).ok());
  GrpcOptions no_certificate;
  no_certificate.tls = Tls("ca", "", false);
  EXPECT_FALSE(CallWith(no_certificate, server->address(), LookupRequest()).ok());
  GrpcOptions stranger;
  stranger.tls = Tls("ca", "stranger", true);
  EXPECT_FALSE(CallWith(stranger, server->address(), LookupRequest()).ok());
}

TEST(GrpcSecurityTest, MissingCertificateFilesAreAClearError) {
  GrpcOptions options;
  options.tls = Tls("ca", "server", false);
  options.tls.key_file = "/nonexistent/server.key";
  GrpcTransport transport(options);
  VariableService service(VariableServiceOptions{"/job:ps/task:0"});
  auto server = transport.Serve("127.0.0.1:0", &service);
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("/nonexistent/server.key"), std::string::npos) << server.status();
}

}  // namespace
}  // namespace shoal
