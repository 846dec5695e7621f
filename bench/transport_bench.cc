// Benchmark (a): push+pull throughput of one variable through shoal's
// transports, against raw loopback TCP measured in the same run.
//
// A shoal iteration assigns a tensor of S bytes to a variable on a server
// (push) and reads it back (pull), so S bytes cross in each direction; with
// T threads, T such calls are in flight. bytes_per_second is per direction.
// "PushAndPull" is an async training step's exchange instead: S bytes of
// gradient pushed and the values after their apply (S bytes) brought back
// in one call, as ucx_perftest's ping-pong moves S bytes each way.
// Raw TCP baselines on one connection: "stream" sends S-byte messages one way
// as fast as the socket takes them; "echo" sends S bytes and waits for S back
// (request/response).
//
// Two ceilings run the same exchange as shoal, with the same calls in flight:
// "RawTcpPushPull" over plain sockets (one connection per thread, no copies
// beyond the kernel's), and "BareGrpcPushPull" over gRPC with nothing of
// shoal's on top (same channel settings, the server keeps the received bytes
// by reference and answers a pull with them). shoal against them is its own
// overhead; they against the stream are what the machine's loopback allows.
//
//   build/bench/transport_bench --benchmark_format=json
#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "shoal/client/client.h"
#include "shoal/transport/grpc/grpc_transport.h"
#include "shoal/transport/grpc/grpc_tuning.h"
#include "shoal/transport/inproc/inproc_transport.h"
#include "shoal/transport/ucx/ucx_transport.h"

namespace shoal {
namespace {

const std::vector<int64_t> kSizes = {1 << 10, 64 << 10, 1 << 20, 16 << 20};

std::string VariableName(int64_t bytes) { return absl::StrCat("x_", bytes); }

// --- bare gRPC: the same exchange with nothing of shoal's on top ----------

constexpr char kBarePush[] = "/bare/Push";
constexpr char kBarePull[] = "/bare/Pull";

// Push keeps the received bytes (the ByteBuffer shares its slices, no copy);
// pull answers with the bytes last pushed.
class BareService final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    return new Reactor(this, context->method() == kBarePush);
  }

 private:
  class Reactor final : public grpc::ServerGenericBidiReactor {
   public:
    Reactor(BareService* service, bool push) : service_(service), push_(push) { StartRead(&request_); }
    void OnReadDone(bool ok) override {
      if (!ok) return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request"));
      {
        std::lock_guard<std::mutex> lock(service_->mu_);
        if (push_) {
          service_->value_ = request_;
          grpc::Slice empty;
          response_ = grpc::ByteBuffer(&empty, 1);
        } else {
          response_ = service_->value_;
        }
      }
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
    }
    void OnDone() override { delete this; }

   private:
    BareService* service_;
    bool push_;
    grpc::ByteBuffer request_, response_;
  };

  std::mutex mu_;
  grpc::ByteBuffer value_;
};

// Unary calls spread over two connections, as GrpcTransport's channels do.
class BareClient {
 public:
  explicit BareClient(const std::string& address) {
    for (int i = 0; i < 2; ++i) {
      const grpc::ChannelArguments args = PeerChannelArguments(i, /*message_limit=*/-1);
      stubs_.push_back(std::make_unique<grpc::GenericStub>(
          grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args)));
    }
  }

  grpc::Status Call(const char* method, const grpc::ByteBuffer& request, grpc::ByteBuffer* response) {
    grpc::ClientContext context;
    absl::Notification done;
    grpc::Status status;
    grpc::GenericStub& stub = *stubs_[next_.fetch_add(1) % stubs_.size()];
    stub.UnaryCall(&context, method, grpc::StubOptions(), &request, response, [&](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
    done.WaitForNotification();
    return status;
  }

 private:
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
  std::atomic<size_t> next_{0};
};

// --- servers in a child process ------------------------------------------

struct ServerAddresses {
  std::string shoal;    // a ps task
  std::string bare;     // the bare gRPC service
  std::string ucx;      // a ps task over UCX (shared memory to this process)
  std::string ucx_tcp;  // a ps task over UCX limited to TCP
};

std::string ReadLine(int fd) {
  std::string line;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') line.push_back(c);
  return line;
}

// Starts a ps server and the bare gRPC service in a child process (before
// this process uses gRPC, which does not survive fork), as in a real job: in
// one process the client's and the server's gRPC threads would share one
// pool. The child ends with this process.
const ServerAddresses& ForkGrpcServers() {
  static const ServerAddresses* addresses = [] {
    int fds[2];
    if (pipe(fds) != 0) std::abort();
    pid_t pid = fork();
    if (pid < 0) std::abort();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(fds[0]);
      GrpcTransport transport;
      VariableService service(VariableServiceOptions{"/job:ps/task:0"});
      auto server = transport.Serve("127.0.0.1:0", &service);
      BareService bare;
      grpc::ServerBuilder builder;
      int bare_port = 0;
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &bare_port);
      ConfigureServer(builder, /*message_limit=*/-1);
      builder.RegisterCallbackGenericService(&bare);
      std::unique_ptr<grpc::Server> bare_server = builder.BuildAndStart();
      VariableService ucx_service(VariableServiceOptions{"/job:ps/task:0"});
      VariableService ucx_tcp_service(VariableServiceOptions{"/job:ps/task:0"});
      UcxOptions tcp_only;
      tcp_only.ucx_transports = "tcp";
      auto ucx = UcxTransport::Create();
      auto ucx_tcp = UcxTransport::Create(tcp_only);
      auto ucx_server = ucx.ok() ? (*ucx)->Serve("127.0.0.1:0", &ucx_service) : ucx.status();
      auto ucx_tcp_server = ucx_tcp.ok() ? (*ucx_tcp)->Serve("127.0.0.1:0", &ucx_tcp_service) : ucx_tcp.status();
      std::string lines = absl::StrCat(server.ok() ? (*server)->address() : "", "\n",
                                       bare_port > 0 ? absl::StrCat("127.0.0.1:", bare_port) : "", "\n",
                                       ucx_server.ok() ? (*ucx_server)->address() : "", "\n",
                                       ucx_tcp_server.ok() ? (*ucx_tcp_server)->address() : "", "\n");
      if (::write(fds[1], lines.data(), lines.size()) < 0) _exit(1);
      service.shutdown_requested().WaitForNotification();
      _exit(0);
    }
    close(fds[1]);
    auto* result = new ServerAddresses;
    result->shoal = ReadLine(fds[0]);
    result->bare = ReadLine(fds[0]);
    result->ucx = ReadLine(fds[0]);
    result->ucx_tcp = ReadLine(fds[0]);
    close(fds[0]);
    if (result->shoal.empty() || result->bare.empty() || result->ucx.empty() || result->ucx_tcp.empty()) std::abort();
    return result;
  }();
  return *addresses;
}

// Plain SGD with a rate small enough that pushing the payload as a gradient
// for as long as the bench runs leaves the values where they were.
wire::OptimizerConfig TinySgd() {
  wire::OptimizerConfig sgd;
  sgd.set_kind("sgd");
  sgd.set_learning_rate(1e-9);
  return sgd;
}

// One ps task serving a variable of each size, and a client for it.
struct Setup {
  InProcNetwork network;
  std::unique_ptr<Transport> transport;
  std::unique_ptr<VariableService> service;
  std::unique_ptr<ServerHandle> server;
  std::unique_ptr<Client> client;
  std::map<int64_t, torch::Tensor> payloads;

  enum Kind { kInProc, kGrpc, kUcx, kUcxTcp };
  explicit Setup(Kind kind) {
    std::string address;
    if (kind == kGrpc) {
      // The ps runs in its own process, as in a real job: in one process the
      // client's and the server's gRPC threads would share one pool.
      address = ForkGrpcServers().shoal;
      transport = std::make_unique<GrpcTransport>();
    } else if (kind == kUcx || kind == kUcxTcp) {
      UcxOptions options;
      if (kind == kUcxTcp) options.ucx_transports = "tcp";
      address = kind == kUcx ? ForkGrpcServers().ucx : ForkGrpcServers().ucx_tcp;
      transport = UcxTransport::Create(options).value();
    } else {
      transport = std::make_unique<InProcTransport>(&network);
      service = std::make_unique<VariableService>(VariableServiceOptions{"/job:ps/task:0"});
      server = transport->Serve("inproc:ps:0", service.get()).value();
      address = server->address();
    }
    auto cluster = ClusterSpec::Create({{"ps", {address}}, {"worker", {"unused:1"}}}).value();
    std::vector<VariableSpec> specs;
    std::vector<VariableInit> inits;
    for (int64_t bytes : kSizes) {
      payloads[bytes] = torch::rand({bytes / 4});
      specs.push_back({VariableName(bytes), {bytes / 4}});
      inits.push_back({VariableName(bytes), payloads[bytes], TinySgd(), false});
    }
    auto placement = std::make_shared<const Placement>(Placement::Create(specs, cluster, {}).value());
    client = Client::Create(cluster, transport.get(), placement).value();
    if (!client->CreateVariables(inits).ok()) std::abort();
  }
};

Setup& InProcSetup() {
  static auto* setup = new Setup(Setup::kInProc);
  return *setup;
}
Setup& GrpcSetup() {
  static auto* setup = new Setup(Setup::kGrpc);
  return *setup;
}
Setup& UcxSetup() {
  static auto* setup = new Setup(Setup::kUcx);
  return *setup;
}
Setup& UcxTcpSetup() {
  static auto* setup = new Setup(Setup::kUcxTcp);
  return *setup;
}

void PushPull(benchmark::State& state, Setup& setup) {
  const int64_t bytes = state.range(0);
  const std::vector<std::string> names = {VariableName(bytes)};
  const std::vector<torch::Tensor> values = {setup.payloads[bytes]};
  for (auto _ : state) {
    if (!setup.client->Assign(names, values).ok()) state.SkipWithError("assign failed");
    auto read = setup.client->Read(names);
    if (!read.ok()) state.SkipWithError(std::string(read.status().ToString()).c_str());
    benchmark::DoNotOptimize(read);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

// The exchange of an async training step (AsyncPolicy): the gradient pushed
// and the values after its apply brought back in one round trip.
void PushAndPull(benchmark::State& state, Setup& setup) {
  const int64_t bytes = state.range(0);
  const std::vector<std::string> names = {VariableName(bytes)};
  const std::vector<torch::Tensor> gradients = {setup.payloads[bytes]};
  for (auto _ : state) {
    auto applied = setup.client->ApplyGradientsAndRead(names, gradients);
    if (!applied.ok()) state.SkipWithError(std::string(applied.status().ToString()).c_str());
    benchmark::DoNotOptimize(applied);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

void BM_InProcPushPull(benchmark::State& state) { PushPull(state, InProcSetup()); }
void BM_GrpcPushPull(benchmark::State& state) { PushPull(state, GrpcSetup()); }
void BM_UcxShmPushPull(benchmark::State& state) { PushPull(state, UcxSetup()); }
void BM_UcxTcpPushPull(benchmark::State& state) { PushPull(state, UcxTcpSetup()); }
void BM_GrpcPushAndPull(benchmark::State& state) { PushAndPull(state, GrpcSetup()); }
void BM_UcxShmPushAndPull(benchmark::State& state) { PushAndPull(state, UcxSetup()); }
void BM_UcxTcpPushAndPull(benchmark::State& state) { PushAndPull(state, UcxTcpSetup()); }

void BM_BareGrpcPushPull(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  static BareClient* client = new BareClient(ForkGrpcServers().bare);
  const std::vector<char> payload(bytes, 'x');
  grpc::Slice slice(payload.data(), payload.size(), grpc::Slice::STATIC_SLICE);
  const grpc::ByteBuffer request(&slice, 1);
  grpc::Slice empty;
  const grpc::ByteBuffer pull_request(&empty, 1);
  for (auto _ : state) {
    grpc::ByteBuffer acknowledgement, value;
    grpc::Status pushed = client->Call(kBarePush, request, &acknowledgement);
    if (!pushed.ok()) state.SkipWithError(("bare push: " + pushed.error_message()).c_str());
    if (!client->Call(kBarePull, pull_request, &value).ok() || value.Length() != static_cast<size_t>(bytes)) {
      state.SkipWithError("bare pull failed");
    }
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

// --- raw TCP on loopback -------------------------------------------------

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool ReadAll(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = ::read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// What a framed message ([u64 length][u8 mode][bytes]) asks of the peer.
enum Mode : uint8_t {
  kDrop = 0,      // read the bytes, answer nothing
  kEcho = 1,      // answer with the bytes
  kAck = 2,       // answer with one byte
  kSendBack = 3,  // no bytes follow; answer with `length` bytes (a pull)
};

// One connection and the thread that serves its other end.
class RawTcpPeer {
 public:
  RawTcpPeer() {
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
    listen(listener, 1);
    client_ = socket(AF_INET, SOCK_STREAM, 0);
    connect(client_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    server_ = accept(listener, nullptr, nullptr);
    close(listener);
    int one = 1;
    setsockopt(client_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(server_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    thread_ = std::thread([this] { Serve(); });
  }
  int fd() const { return client_; }

  void Send(const char* data, uint64_t bytes, Mode mode) {
    char header[9];
    std::memcpy(header, &bytes, 8);
    header[8] = static_cast<char>(mode);
    WriteAll(client_, header, 9);
    if (mode != kSendBack) WriteAll(client_, data, bytes);
  }

 private:
  void Serve() {
    std::vector<char> buffer;
    char header[9];
    while (ReadAll(server_, header, 9)) {
      uint64_t bytes;
      std::memcpy(&bytes, header, 8);
      const Mode mode = static_cast<Mode>(header[8]);
      if (buffer.size() < bytes) buffer.resize(bytes);
      if (mode != kSendBack && !ReadAll(server_, buffer.data(), bytes)) break;
      if (mode == kEcho || mode == kSendBack) WriteAll(server_, buffer.data(), bytes);
      if (mode == kAck) WriteAll(server_, "k", 1);
    }
  }

  int client_ = -1, server_ = -1;
  std::thread thread_;
};

// The connection of benchmark thread `index` (stream and echo use thread 0's).
RawTcpPeer& TcpPeer(int index = 0) {
  static std::mutex mu;
  static auto* peers = new std::map<int, std::unique_ptr<RawTcpPeer>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& peer = (*peers)[index];
  if (peer == nullptr) peer = std::make_unique<RawTcpPeer>();
  return *peer;
}

void BM_RawTcpStream(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  std::vector<char> message(bytes, 'x');
  RawTcpPeer& peer = TcpPeer();
  for (auto _ : state) peer.Send(message.data(), bytes, kDrop);
  char ack;
  peer.Send(message.data(), 0, kAck);  // everything sent has been read once this is acknowledged
  ReadAll(peer.fd(), &ack, 1);
  state.SetBytesProcessed(state.iterations() * bytes);
}

void BM_RawTcpEcho(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  std::vector<char> message(bytes, 'x'), reply(bytes);
  RawTcpPeer& peer = TcpPeer();
  for (auto _ : state) {
    peer.Send(message.data(), bytes, kEcho);
    ReadAll(peer.fd(), reply.data(), bytes);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

// shoal's exchange over plain sockets: push S bytes and wait for the
// acknowledgement, then ask for S bytes and read them; one connection per
// benchmark thread.
void BM_RawTcpPushPull(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  std::vector<char> message(bytes, 'x'), reply(bytes);
  RawTcpPeer& peer = TcpPeer(state.thread_index());
  char ack;
  for (auto _ : state) {
    peer.Send(message.data(), bytes, kAck);
    ReadAll(peer.fd(), &ack, 1);
    peer.Send(nullptr, bytes, kSendBack);
    ReadAll(peer.fd(), reply.data(), bytes);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t bytes : kSizes) b->Arg(bytes);
  b->UseRealTime()->MinTime(0.5);
}

// The same calls in flight for shoal and its two ceilings.
void InFlight(benchmark::internal::Benchmark* b) {
  Sizes(b);
  b->Threads(1)->Threads(2)->Threads(4)->Threads(8);
}

BENCHMARK(BM_RawTcpStream)->Apply(Sizes);
BENCHMARK(BM_RawTcpEcho)->Apply(Sizes);
BENCHMARK(BM_RawTcpPushPull)->Apply(InFlight);
BENCHMARK(BM_InProcPushPull)->Apply(Sizes);
BENCHMARK(BM_BareGrpcPushPull)->Apply(InFlight);
BENCHMARK(BM_GrpcPushPull)->Apply(InFlight);
BENCHMARK(BM_UcxShmPushPull)->Apply(InFlight);
BENCHMARK(BM_UcxTcpPushPull)->Apply(InFlight);
BENCHMARK(BM_GrpcPushAndPull)->Apply(InFlight);
BENCHMARK(BM_UcxShmPushAndPull)->Apply(InFlight);
BENCHMARK(BM_UcxTcpPushAndPull)->Apply(InFlight);

// Diagnostics, outside bench/run.sh: each direction alone.
void BM_GrpcPullOnly(benchmark::State& state) {
  Setup& setup = GrpcSetup();
  const std::vector<std::string> names = {VariableName(state.range(0))};
  for (auto _ : state) benchmark::DoNotOptimize(setup.client->Read(names));
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
void BM_GrpcPushOnly(benchmark::State& state) {
  Setup& setup = GrpcSetup();
  const std::vector<std::string> names = {VariableName(state.range(0))};
  const std::vector<torch::Tensor> values = {setup.payloads[state.range(0)]};
  for (auto _ : state) benchmark::DoNotOptimize(setup.client->Assign(names, values));
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_GrpcPullOnly)->Apply(Sizes)->Threads(1)->Threads(4);
BENCHMARK(BM_GrpcPushOnly)->Apply(Sizes)->Threads(1)->Threads(4);

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) {
  shoal::KeepLargeAllocationsMapped();
  // Fork from the main thread: the servers' process dies with the thread
  // that forked it (PR_SET_PDEATHSIG), and benchmark threads come and go.
  shoal::ForkGrpcServers();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
