// The scaling table: C clients, each its own process, push and pull a 4 MiB
// model (four 1 MiB variables, round robin over the ps tasks) as fast as
// they can for a few seconds, against 1 or 2 ps tasks, each its own process;
// over gRPC and over UCX (FastPathTransport, as `transport.kind: auto` runs
// a job). Prints one JSON line per cell: the aggregate GB/s each ps serves
// per direction (bytes pushed / seconds / ps tasks; as many are pulled).
//
//   build/bench/scaling_bench [--seconds 3] [--clients 1,2,4,8] [--ps 1,2] [--transports grpc,ucx]
//   build/bench/scaling_bench --idle_s 10 [--transport ucx]
//
// The second form measures "no spinning": one ps and one client that has
// pushed and pulled for a second and stays connected; then the CPU the ps
// process uses over idle_s seconds, as a fraction of one core.
//
// The same binary plays the ps (--role ps) and the clients (--role client).
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "shoal/client/client.h"
#include "shoal/transport/fast_path_transport.h"
#include "shoal/transport/grpc/grpc_transport.h"
#include "shoal/transport/ucx/ucx_transport.h"

namespace shoal {
namespace {

constexpr int kVariables = 4;
constexpr int64_t kVariableBytes = 1 << 20;

std::unique_ptr<Transport> MakeBenchTransport(const std::string& kind) {
  if (kind == "grpc") return std::make_unique<GrpcTransport>();
  return std::make_unique<FastPathTransport>(std::make_unique<GrpcTransport>(), UcxTransport::Create().value(), "ucx");
}

std::string Flag(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] == "--" + name) return argv[i + 1];
  }
  return fallback;
}

// --role ps: serves until stdin closes (the driver ends).
int RunPs(const std::string& transport_kind) {
  auto transport = MakeBenchTransport(transport_kind);
  VariableService service(VariableServiceOptions{"/job:ps/task:0"});
  auto server = transport->Serve("127.0.0.1:0", &service);
  if (!server.ok()) {
    std::cerr << server.status() << "\n";
    return 1;
  }
  std::cout << (*server)->address() << std::endl;
  char c;
  while (read(0, &c, 1) > 0) {
  }
  return 0;
}

// --role client: creates the variables (client 0) or waits for them, then
// pushes and pulls from `start` (unix ns) for `seconds`; prints the bytes pushed.
int RunClient(const std::string& transport_kind, const std::string& ps_list, int index, int64_t start_ns,
              double seconds, double linger_s) {
  auto transport = MakeBenchTransport(transport_kind);
  std::vector<std::string> ps = absl::StrSplit(ps_list, ',');
  auto cluster = ClusterSpec::Create({{"ps", ps}, {"worker", {"unused:1"}}}).value();
  std::vector<VariableSpec> specs;
  std::vector<VariableInit> inits;
  std::vector<std::string> names;
  std::vector<torch::Tensor> values;
  for (int v = 0; v < kVariables; ++v) {
    names.push_back(absl::StrCat("v", v));
    values.push_back(torch::rand({kVariableBytes / 4}));
    specs.push_back({names.back(), {kVariableBytes / 4}});
    inits.push_back({names.back(), values.back(), wire::OptimizerConfig(), false});
  }
  auto placement = std::make_shared<const Placement>(Placement::Create(specs, cluster, {}).value());
  auto client = Client::Create(cluster, transport.get(), placement).value();
  absl::Status ready = index == 0 ? client->CreateVariables(inits) : client->WaitForVariables(names, absl::Seconds(30));
  if (!ready.ok()) {
    std::cerr << "client " << index << ": " << ready << "\n";
    return 1;
  }
  // One exchange before the clock starts: connections are made.
  if (!client->Assign(names, values).ok()) return 1;
  absl::SleepFor(absl::FromUnixNanos(start_ns) - absl::Now());
  const absl::Time end = absl::FromUnixNanos(start_ns) + absl::Seconds(seconds);
  int64_t exchanges = 0;
  while (absl::Now() < end) {
    if (!client->Assign(names, values).ok() || !client->Read(names).ok()) {
      std::cerr << "client " << index << ": an exchange failed\n";
      return 1;
    }
    ++exchanges;
  }
  std::cout << exchanges * kVariables * kVariableBytes << std::endl;
  absl::SleepFor(absl::Seconds(linger_s));  // connected, and silent
  return 0;
}

// A child running this binary with `args`; its stdout comes back through `out`.
pid_t Spawn(const std::string& self, const std::vector<std::string>& args, int* out, int* in = nullptr) {
  // Close-on-exec: no other child may hold a ps's stdin open (it serves
  // until that closes).
  int out_pipe[2], in_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(in_pipe, O_CLOEXEC) != 0) std::abort();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(out_pipe[1], 1);
    dup2(in_pipe[0], 0);
    close(out_pipe[0]);
    close(in_pipe[1]);
    std::vector<char*> argv = {const_cast<char*>(self.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(self.c_str(), argv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(in_pipe[0]);
  *out = out_pipe[0];
  if (in != nullptr) {
    *in = in_pipe[1];
  } else {
    close(in_pipe[1]);
  }
  return pid;
}

std::string ReadLine(int fd) {
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') line.push_back(c);
  return line;
}

// User + system CPU seconds of process `pid` so far (/proc/<pid>/stat).
double CpuSecondsOf(pid_t pid) {
  std::FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r");
  if (f == nullptr) return -1;
  char buffer[4096] = {};
  const size_t n = std::fread(buffer, 1, sizeof(buffer) - 1, f);
  std::fclose(f);
  // Fields after the command's closing parenthesis: state is field 3;
  // utime and stime are fields 14 and 15.
  const char* rest = std::strrchr(buffer, ')');
  if (rest == nullptr || n == 0) return -1;
  std::vector<std::string> fields = absl::StrSplit(rest + 2, ' ');
  double utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtod(fields[11], &utime) || !absl::SimpleAtod(fields[12], &stime)) return -1;
  return (utime + stime) / sysconf(_SC_CLK_TCK);
}

// The CPU an idle ps uses, its one client connected and silent.
double MeasureIdle(const std::string& self, const std::string& transport, double idle_s) {
  int ps_out = -1, ps_in = -1;
  const pid_t ps = Spawn(self, {"--role", "ps", "--transport", transport}, &ps_out, &ps_in);
  const std::string address = ReadLine(ps_out);
  close(ps_out);
  int client_out = -1;
  const int64_t start_ns = absl::ToUnixNanos(absl::Now() + absl::Seconds(2));
  const pid_t client = Spawn(self,
                             {"--role", "client", "--transport", transport, "--ps_addresses", address, "--start_ns",
                              std::to_string(start_ns), "--seconds", "1", "--linger_s", absl::StrCat(idle_s + 5)},
                             &client_out);
  ReadLine(client_out);  // it has exchanged for a second and now waits
  absl::SleepFor(absl::Milliseconds(100));
  const double before = CpuSecondsOf(ps);
  absl::SleepFor(absl::Seconds(idle_s));
  const double used = CpuSecondsOf(ps) - before;
  kill(client, SIGKILL);
  waitpid(client, nullptr, 0);
  close(client_out);
  close(ps_in);
  waitpid(ps, nullptr, 0);
  return before < 0 ? -1 : used / idle_s;
}

// One cell of the table; a negative rate when something failed.
double MeasureCell(const std::string& self, const std::string& transport, int ps_tasks, int clients,
                   double seconds) {
  std::vector<pid_t> ps_pids;
  std::vector<int> ps_stdin;
  std::vector<std::string> addresses;
  for (int p = 0; p < ps_tasks; ++p) {
    int out = -1, in = -1;
    ps_pids.push_back(Spawn(self, {"--role", "ps", "--transport", transport}, &out, &in));
    ps_stdin.push_back(in);
    addresses.push_back(ReadLine(out));
    close(out);
  }
  // Time for every client to start, connect and create or find the model.
  const int64_t start_ns = absl::ToUnixNanos(absl::Now() + absl::Seconds(3));
  std::vector<pid_t> client_pids;
  std::vector<int> client_out;
  for (int c = 0; c < clients; ++c) {
    int out = -1;
    client_pids.push_back(Spawn(self,
                                {"--role", "client", "--transport", transport, "--ps_addresses",
                                 absl::StrJoin(addresses, ","), "--index", std::to_string(c), "--start_ns",
                                 std::to_string(start_ns), "--seconds", absl::StrCat(seconds)},
                                &out));
    client_out.push_back(out);
  }
  double bytes = 0;
  bool failed = false;
  for (int c = 0; c < clients; ++c) {
    int64_t moved = 0;
    if (!absl::SimpleAtoi(ReadLine(client_out[c]), &moved)) failed = true;
    bytes += static_cast<double>(moved);
    close(client_out[c]);
    waitpid(client_pids[c], nullptr, 0);
  }
  for (int p = 0; p < ps_tasks; ++p) {
    close(ps_stdin[p]);
    waitpid(ps_pids[p], nullptr, 0);
  }
  return failed ? -1 : bytes / seconds / ps_tasks / 1e9;
}

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) {
  shoal::KeepLargeAllocationsMapped();
  using shoal::Flag;
  const std::string role = Flag(argc, argv, "role", "driver");
  const std::string transport = Flag(argc, argv, "transport", "ucx");
  double seconds = 3;
  (void)absl::SimpleAtod(Flag(argc, argv, "seconds", "3"), &seconds);
  if (role == "ps") return shoal::RunPs(transport);
  if (role == "client") {
    int index = 0;
    int64_t start_ns = 0;
    (void)absl::SimpleAtoi(Flag(argc, argv, "index", "0"), &index);
    (void)absl::SimpleAtoi(Flag(argc, argv, "start_ns", "0"), &start_ns);
    double linger_s = 0;
    (void)absl::SimpleAtod(Flag(argc, argv, "linger_s", "0"), &linger_s);
    return shoal::RunClient(transport, Flag(argc, argv, "ps_addresses", ""), index, start_ns, seconds, linger_s);
  }
  const std::string self = "/proc/self/exe";
  char path[4096];
  const ssize_t n = readlink(self.c_str(), path, sizeof(path) - 1);
  const std::string binary = n > 0 ? std::string(path, n) : std::string(argv[0]);
  double idle_s = 0;
  if (absl::SimpleAtod(Flag(argc, argv, "idle_s", "0"), &idle_s) && idle_s > 0) {
    std::printf("{\"transport\": \"%s\", \"idle_s\": %g, \"idle_ps_cpu_fraction_of_a_core\": %.4f}\n",
                transport.c_str(), idle_s, shoal::MeasureIdle(binary, transport, idle_s));
    return 0;
  }
  const std::vector<std::string> kinds = absl::StrSplit(Flag(argc, argv, "transports", "grpc,ucx"), ',');
  const std::vector<std::string> ps_counts = absl::StrSplit(Flag(argc, argv, "ps", "1,2"), ',');
  const std::vector<std::string> client_counts = absl::StrSplit(Flag(argc, argv, "clients", "1,2,4,8"), ',');
  for (const std::string& kind : kinds) {
    for (const std::string& ps_text : ps_counts) {
      for (const std::string& clients_text : client_counts) {
        int ps = 1, clients = 1;
        (void)absl::SimpleAtoi(ps_text, &ps);
        (void)absl::SimpleAtoi(clients_text, &clients);
        const double rate = shoal::MeasureCell(binary, kind, ps, clients, seconds);
        std::printf("{\"transport\": \"%s\", \"ps\": %d, \"clients\": %d, \"gb_per_s_per_ps\": %.3f}\n", kind.c_str(),
                    ps, clients, rate);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
