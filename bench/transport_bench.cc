// Benchmark (a): push+pull throughput of one variable through shoal's
// transports, against raw loopback TCP measured in the same run.
//
// A shoal iteration assigns a tensor of S bytes to a variable on a server
// (push) and reads it back (pull), so S bytes cross in each direction; with
// T threads, T such calls are in flight. bytes_per_second is per direction.
// Raw TCP baselines on one connection: "stream" sends S-byte messages one way
// as fast as the socket takes them; "echo" sends S bytes and waits for S back
// (request/response).
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

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "shoal/client/client.h"
#include "shoal/transport/grpc/grpc_transport.h"
#include "shoal/transport/inproc/inproc_transport.h"

namespace shoal {
namespace {

const std::vector<int64_t> kSizes = {1 << 10, 64 << 10, 1 << 20, 16 << 20};

std::string VariableName(int64_t bytes) { return absl::StrCat("x_", bytes); }

// Starts a ps server in a child process (before this process uses gRPC,
// which does not survive fork) and returns its address. The child ends with
// this process.
std::string ForkGrpcServer() {
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
    std::string address = server.ok() ? (*server)->address() : "";
    address.push_back('\n');
    if (::write(fds[1], address.data(), address.size()) < 0) _exit(1);
    service.shutdown_requested().WaitForNotification();
    _exit(0);
  }
  close(fds[1]);
  std::string address;
  char c;
  while (::read(fds[0], &c, 1) == 1 && c != '\n') address.push_back(c);
  close(fds[0]);
  if (address.empty()) std::abort();
  return address;
}

// One ps task serving a variable of each size, and a client for it.
struct Setup {
  InProcNetwork network;
  std::unique_ptr<Transport> transport;
  std::unique_ptr<VariableService> service;
  std::unique_ptr<ServerHandle> server;
  std::unique_ptr<Client> client;
  std::map<int64_t, torch::Tensor> payloads;

  explicit Setup(bool grpc) {
    std::string address;
    if (grpc) {
      // The ps runs in its own process, as in a real job: in one process the
      // client's and the server's gRPC threads would share one pool.
      address = ForkGrpcServer();
      transport = std::make_unique<GrpcTransport>();
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
      inits.push_back({VariableName(bytes), payloads[bytes], wire::OptimizerConfig(), false});
    }
    auto placement = std::make_shared<const Placement>(Placement::Create(specs, cluster, {}).value());
    client = Client::Create(cluster, transport.get(), placement).value();
    if (!client->CreateVariables(inits).ok()) std::abort();
  }
};

Setup& InProcSetup() {
  static auto* setup = new Setup(false);
  return *setup;
}
Setup& GrpcSetup() {
  static auto* setup = new Setup(true);
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

void BM_InProcPushPull(benchmark::State& state) { PushPull(state, InProcSetup()); }
void BM_GrpcPushPull(benchmark::State& state) { PushPull(state, GrpcSetup()); }

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

// A peer that reads framed messages ([u64 length][u8 mode][bytes]) and, by
// mode, echoes them (1), acknowledges with one byte (2), or just drops them (0).
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

  void Send(const char* data, uint64_t bytes, uint8_t mode) {
    char header[9];
    std::memcpy(header, &bytes, 8);
    header[8] = static_cast<char>(mode);
    WriteAll(client_, header, 9);
    WriteAll(client_, data, bytes);
  }

 private:
  void Serve() {
    std::vector<char> buffer;
    char header[9];
    while (ReadAll(server_, header, 9)) {
      uint64_t bytes;
      std::memcpy(&bytes, header, 8);
      if (buffer.size() < bytes) buffer.resize(bytes);
      if (!ReadAll(server_, buffer.data(), bytes)) break;
      if (header[8] == 1) WriteAll(server_, buffer.data(), bytes);
      if (header[8] == 2) WriteAll(server_, "k", 1);
    }
  }

  int client_ = -1, server_ = -1;
  std::thread thread_;
};

RawTcpPeer& TcpPeer() {
  static auto* peer = new RawTcpPeer();
  return *peer;
}

void BM_RawTcpStream(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  std::vector<char> message(bytes, 'x');
  RawTcpPeer& peer = TcpPeer();
  for (auto _ : state) peer.Send(message.data(), bytes, 0);
  char ack;
  peer.Send(message.data(), 0, 2);  // everything sent has been read once this is acknowledged
  ReadAll(peer.fd(), &ack, 1);
  state.SetBytesProcessed(state.iterations() * bytes);
}

void BM_RawTcpEcho(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  std::vector<char> message(bytes, 'x'), reply(bytes);
  RawTcpPeer& peer = TcpPeer();
  for (auto _ : state) {
    peer.Send(message.data(), bytes, 1);
    ReadAll(peer.fd(), reply.data(), bytes);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t bytes : kSizes) b->Arg(bytes);
  b->UseRealTime()->MinTime(0.5);
}

BENCHMARK(BM_RawTcpStream)->Apply(Sizes);
BENCHMARK(BM_RawTcpEcho)->Apply(Sizes);
BENCHMARK(BM_InProcPushPull)->Apply(Sizes);
BENCHMARK(BM_GrpcPushPull)->Apply(Sizes)->Threads(1)->Threads(2)->Threads(4)->Threads(8);

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) {
  shoal::KeepLargeAllocationsMapped();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
namespace shoal {
namespace {
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
