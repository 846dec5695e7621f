// Transient failures never end a job: a ps that answers late, and a link
// to it cut for half a second mid-job, without checkpoints to fall back on.
// The ps sits behind a TCP proxy (tcp_proxy.h) at the address the cluster
// names; it really listens on a spare port (--bind). The proxy sees only
// that address, so these jobs keep every call on gRPC (transport.kind:
// grpc); over UCX the tensors would go around it, to the port the ps
// advertises. The partition test cuts a link for both transports.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "process_helpers.h"
#include "quick_job.h"
#include "tcp_proxy.h"

namespace shoal {
namespace {

JobConfig OverGrpc(JobConfig config) {
  config.transport.kind = "grpc";
  return config;
}

struct ProxiedPsJob {
  ProxiedPsJob(const std::string& name, JobConfig config, absl::Duration reply_delay)
      : cluster(name, 1, 2, OverGrpc(config), /*spare_ports=*/1),
        proxy(cluster.PortOf({"ps", 0}), cluster.spare_port(0), reply_delay) {}

  void Start() {
    ps = cluster.Start("server", "ps:0", "ps.err", {"--bind", "127.0.0.1:" + std::to_string(cluster.spare_port(0))});
    chief = cluster.Start("worker", "worker:0", "chief.err");
    worker = cluster.Start("worker", "worker:1", "worker1.err");
  }
  // Waits for every task; true when all three exited with 0.
  bool Finish(absl::Duration timeout) {
    chief_status = WaitFor(chief, timeout);
    worker_status = WaitFor(worker, absl::Seconds(30));
    ps_status = WaitFor(ps, absl::Seconds(30));
    for (pid_t pid : {chief, worker, ps}) kill(pid, SIGKILL);
    auto exited_well = [](int status) { return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0; };
    return exited_well(chief_status) && exited_well(worker_status) && exited_well(ps_status);
  }
  std::string Errors() const {
    return "chief: " + cluster.ReadFile("chief.err") + "\nworker 1: " + cluster.ReadFile("worker1.err") +
           "\nps: " + cluster.ReadFile("ps.err");
  }
  nlohmann::json Result() const { return nlohmann::json::parse(cluster.ReadFile("worker:0.json"), nullptr, false); }

  ProcessCluster cluster;
  TcpProxy proxy;
  pid_t ps = -1, chief = -1, worker = -1;
  int chief_status = -1, worker_status = -1, ps_status = -1;
};

// gRPC's connection attempt used to get 100 ms for TCP and the HTTP/2
// handshake: a ps whose answers arrive 300 ms late was never reached.
TEST(TransientFaultTest, APsThatAnswers300MsLateIsReachedAndTheJobEnds) {
  JobConfig config = QuickJob();
  config.training.max_steps = 6;
  ProxiedPsJob job("shoal_slow_ps", config, absl::Milliseconds(300));
  ASSERT_TRUE(job.proxy.ok());
  job.Start();
  ASSERT_TRUE(job.Finish(absl::Seconds(120))) << job.Errors();
  const nlohmann::json result = job.Result();
  ASSERT_FALSE(result.is_discarded()) << job.Errors();
  EXPECT_GE(result["global_step"].get<int64_t>(), 6);
  EXPECT_EQ(result["worker_steps"].get<int64_t>(), result["global_step"].get<int64_t>());
}

// A blip shorter than the RPC deadline is invisible to training: every
// connection to the ps breaks, and new ones are turned away for 0.5 s. The
// calls caught in it are sent again and applied once: the global step equals
// the steps the workers made, none lost and none counted twice.
TEST(TransientFaultTest, AHalfSecondBlipMidJobIsInvisibleToTraining) {
  JobConfig config = QuickJob();
  config.training.max_steps = 600;
  ProxiedPsJob job("shoal_blip", config, absl::ZeroDuration());
  ASSERT_TRUE(job.proxy.ok());
  job.Start();
  ASSERT_GE(WaitForStep(job.cluster.MetricsFile(0), "global_step", 150), 150) << job.Errors();
  job.proxy.Cut(absl::Milliseconds(500));
  ASSERT_TRUE(job.Finish(absl::Seconds(120))) << job.Errors();
  EXPECT_GT(job.proxy.broken(), 0);
  const nlohmann::json result = job.Result();
  ASSERT_FALSE(result.is_discarded()) << job.Errors();
  EXPECT_GE(result["global_step"].get<int64_t>(), 600);
  EXPECT_EQ(result["worker_steps"].get<int64_t>(), result["global_step"].get<int64_t>());
  EXPECT_GT(result["calls_retried"].get<int64_t>(), 0) << "the blip caught no call";
  EXPECT_TRUE(result["recoveries"].empty());
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.7);
}

}  // namespace
}  // namespace shoal
