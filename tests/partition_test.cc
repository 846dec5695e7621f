// A network partition, for real: the ps task runs in its own network
// namespace, joined to the workers by a veth pair; the test cuts the link
// for a while. The workers' calls fail after the RPC deadline, naming the
// ps; they wait for the job to recover, and once the link is back training
// goes on and the job ends. Needs root (ip netns), as CI has.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "process_helpers.h"
#include "shoal/checkpoint/checkpoint.h"
#include "quick_job.h"
#include "source_paths.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;

int Run(const std::string& command) { return std::system((command + " > /dev/null 2>&1").c_str()); }

// A namespace holding one end of a veth pair: 10.213.0.2 inside, 10.213.0.1
// outside. Removed (with the pair) on destruction.
class NetworkNamespace {
 public:
  NetworkNamespace() : name_(absl::StrCat("shoal_ps_", getpid())), host_(absl::StrCat("shh", getpid())),
                       inner_(absl::StrCat("shp", getpid())) {
    Run("ip netns del " + name_);
    ok_ = Run("ip netns add " + name_) == 0 &&
          Run(absl::StrCat("ip link add ", host_, " type veth peer name ", inner_)) == 0 &&
          Run(absl::StrCat("ip link set ", inner_, " netns ", name_)) == 0 &&
          Run(absl::StrCat("ip addr add 10.213.0.1/30 dev ", host_)) == 0 &&
          Run(absl::StrCat("ip link set ", host_, " up")) == 0 &&
          Run(absl::StrCat("ip netns exec ", name_, " ip addr add 10.213.0.2/30 dev ", inner_)) == 0 &&
          Run(absl::StrCat("ip netns exec ", name_, " ip link set ", inner_, " up")) == 0 &&
          Run(absl::StrCat("ip netns exec ", name_, " ip link set lo up")) == 0;
  }
  ~NetworkNamespace() {
    Run("ip link del " + host_);
    Run("ip netns del " + name_);
  }
  bool ok() const { return ok_; }
  const std::string& name() const { return name_; }
  // Cuts the link (packets are dropped, as in a partition), or restores it.
  bool SetLink(bool up) { return Run(absl::StrCat("ip link set ", host_, up ? " up" : " down")) == 0; }

 private:
  std::string name_, host_, inner_;
  bool ok_ = false;
};

pid_t Spawn(const std::vector<std::string>& argv_strings, const std::string& stderr_file) {
  pid_t pid = fork();
  if (pid == 0) {
    if (std::freopen(stderr_file.c_str(), "w", stderr) == nullptr) _exit(126);
    std::vector<char*> argv;
    for (const auto& a : argv_strings) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

TEST(PartitionTest, TheWorkersWaitOutACutLinkToThePsAndTheJobGoesOn) {
  ASSERT_EQ(geteuid(), 0u) << "the partition test needs root for ip netns (CI runs as root)";
  NetworkNamespace ns;
  ASSERT_TRUE(ns.ok()) << "could not set up network namespace " << ns.name() << " (ip netns, veth)";

  const fs::path dir = fs::temp_directory_path() / ("shoal_partition_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<int> ports = FreeLoopbackPorts(3).value();
  const int ps_port = ports[0];
  nlohmann::json cluster = {{"ps", {absl::StrCat("10.213.0.2:", ps_port)}},
                            {"worker", {absl::StrCat("127.0.0.1:", ports[1]),
                                        absl::StrCat("127.0.0.1:", ports[2])}}};
  std::ofstream(dir / "cluster.json") << cluster.dump();
  JobConfig config = QuickJob();
  config.cluster.ps = 1;
  config.training.max_steps = 2000;
  config.transport.rpc_timeout_s = 2;       // a call into the cut link fails after this
  config.transport.startup_timeout_s = 60;  // and the workers wait this long for the job to recover
  config.checkpoint.dir = (dir / "checkpoints").string();
  config.checkpoint.every_steps = 300;
  // The ps listens beyond loopback, which a task without a token refuses to do.
  std::ofstream(dir / "token") << "partition-test-token";
  config.security.token_file = (dir / "token").string();
  std::ofstream(dir / "config.yaml") << JobConfigToYaml(config);
  auto args = [&](const std::string& command, const std::string& task) {
    std::vector<std::string> a = {SHOAL_BINARY, command, "--cluster", (dir / "cluster.json").string(), "--task", task,
                                  "--config", (dir / "config.yaml").string(), "--quiet"};
    if (task == "worker:0") a.insert(a.end(), {"--result_file", (dir / "result.json").string()});
    return a;
  };
  std::vector<std::string> ps_args = {"ip", "netns", "exec", ns.name()};
  for (const auto& a : args("server", "ps:0")) ps_args.push_back(a);
  const pid_t ps = Spawn(ps_args, (dir / "ps.err").string());
  const pid_t chief = Spawn(args("worker", "worker:0"), (dir / "worker0.err").string());
  const pid_t worker = Spawn(args("worker", "worker:1"), (dir / "worker1.err").string());

  // Cut the link once training is under way, for longer than the deadline.
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (!LatestCheckpoint((dir / "checkpoints").string()).ok() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(LatestCheckpoint((dir / "checkpoints").string()).ok()) << "training did not get under way";
  ASSERT_TRUE(ns.SetLink(false));
  absl::SleepFor(absl::Seconds(6));
  ASSERT_TRUE(ns.SetLink(true));

  const int chief_status = WaitFor(chief, absl::Seconds(120));
  const int worker_status = WaitFor(worker, absl::Seconds(30));
  const int ps_status = WaitFor(ps, absl::Seconds(30));
  for (pid_t pid : {chief, worker, ps}) kill(pid, SIGKILL);
  const std::string chief_err = ReadAll(dir / "worker0.err"), worker_err = ReadAll(dir / "worker1.err");
  EXPECT_EQ(chief_status, 0) << chief_err;
  EXPECT_EQ(worker_status, 0) << worker_err;
  EXPECT_EQ(ps_status, 0) << ReadAll(dir / "ps.err");
  // Each worker saw the ps fail within the deadline, naming it, and waited.
  for (const std::string& err : {chief_err, worker_err}) {
    EXPECT_NE(err.find("/job:ps/task:0"), std::string::npos) << err;
    EXPECT_NE(err.find("waiting for the job to recover"), std::string::npos) << err;
  }
  auto result = nlohmann::json::parse(ReadAll(dir / "result.json"), nullptr, false);
  ASSERT_FALSE(result.is_discarded());
  EXPECT_GE(result["global_step"].get<int64_t>(), 2000);
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.75);
  EXPECT_TRUE(result["recoveries"].empty());  // the ps kept its variables: nothing to restore
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shoal
