// SLURM: hostlists and tasks-per-node strings expand as SLURM writes them,
// ranks map to jobs and ports as TensorFlow's SlurmClusterResolver maps
// them, bad variables are named, and a job started the way `srun` starts
// one (the same command everywhere, SLURM's variables apart) trains.
#include "shoal/cluster/slurm.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "process_helpers.h"
#include "quick_job.h"
#include "temp_dir.h"
#include "shoal/strategy/train_report.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;

TEST(SlurmTest, HostlistsExpandAsSlurmWritesThem) {
  EXPECT_EQ(ExpandSlurmHostlist("node[01-03,07],login1").value(),
            (std::vector<std::string>{"node01", "node02", "node03", "node07", "login1"}));
  EXPECT_EQ(ExpandSlurmHostlist("rack[1-2]-n[8-9]").value(),
            (std::vector<std::string>{"rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"}));
  EXPECT_EQ(ExpandSlurmHostlist("gpu7").value(), (std::vector<std::string>{"gpu7"}));
  EXPECT_EQ(ExpandSlurmTasksPerNode("2(x3),1").value(), (std::vector<int>{2, 2, 2, 1}));
  for (const char* bad : {"node[1-", "node[3-1]", "node]1", "n[a-b]", "n[1-2-3]", "n[0-999999]", "a,,b"}) {
    auto hosts = ExpandSlurmHostlist(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(hosts.status())) << bad;
    EXPECT_NE(hosts.status().message().find("SLURM_STEP_NODELIST"), std::string::npos) << hosts.status();
  }
  for (const char* bad : {"", "2(x)", "x", "2(x3", "1(x0)", "1(x99999999)"}) {
    auto counts = ExpandSlurmTasksPerNode(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(counts.status())) << bad;
    EXPECT_NE(counts.status().message().find("SLURM_STEP_TASKS_PER_NODE"), std::string::npos) << counts.status();
  }
}

TEST(SlurmTest, RanksFillTheJobsInOrderAndTheNodesInBlocks) {
  // 6 tasks, 2 on each of 3 nodes: ranks 0-1 the ps on n1, 2-5 the workers.
  const SlurmEnvironment env{"3", "6", "n[1-3]", "2(x3)"};
  auto resolved = ResolveSlurmCluster(env, "ps:2,worker:4", 8888);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->task, (TaskId{"worker", 1}));
  EXPECT_EQ(resolved->cluster.Addresses("ps"), (std::vector<std::string>{"n1:8888", "n1:8889"}));
  EXPECT_EQ(resolved->cluster.Addresses("worker"),
            (std::vector<std::string>{"n2:8888", "n2:8889", "n3:8888", "n3:8889"}));
  EXPECT_EQ(resolved->cluster.Chief(), (TaskId{"worker", 0}));
  // A chief job first: rank 0 is the chief.
  auto chief = ResolveSlurmCluster(SlurmEnvironment{"0", "3", "a,b", "1,2"}, "chief:1,ps:1,worker:1", 2222);
  ASSERT_TRUE(chief.ok()) << chief.status();
  EXPECT_EQ(chief->task, (TaskId{"chief", 0}));
  EXPECT_EQ(chief->cluster.Addresses("worker"), (std::vector<std::string>{"b:2223"}));
}

TEST(SlurmTest, WhatDoesNotAddUpIsNamed) {
  const SlurmEnvironment good{"0", "4", "n[1-2]", "2(x2)"};
  const std::pair<SlurmEnvironment, std::pair<std::string, std::string>> cases[] = {
      {good, {"ps:1,worker:2", "asks for 3 tasks but the job step has 4"}},
      {good, {"ps1,worker:3", "'ps1' is not JOB:COUNT"}},
      {good, {"ps:1,ps:3", "names ps twice"}},
      {good, {"ps:1,gpu:3", "--slurm 'ps:1,gpu:3'"}},  // not a job shoal knows
      {good, {"ps:2000000000,worker:2000000000", "shoal takes at most 65536"}},
      {SlurmEnvironment{"0", "4", "n[1-2]", "2000000000(x2)"}, {"ps:1,worker:3", "places 4000000000 tasks"}},
      {SlurmEnvironment{"", "4", "n[1-2]", "2(x2)"}, {"ps:1,worker:3", "SLURM_PROCID is not set"}},
      {SlurmEnvironment{"4", "4", "n[1-2]", "2(x2)"}, {"ps:1,worker:3", "SLURM_PROCID 4 is not below"}},
      {SlurmEnvironment{"0", "4", "n[1-3]", "2(x2)"}, {"ps:1,worker:3", "gives 2 nodes but SLURM_STEP_NODELIST"}},
      {SlurmEnvironment{"0", "4", "n[1-2]", "3,2"}, {"ps:1,worker:3", "places 5 tasks but SLURM_STEP_NUM_TASKS is 4"}},
  };
  for (const auto& [env, spec_and_message] : cases) {
    const auto& [spec, message] = spec_and_message;
    auto resolved = ResolveSlurmCluster(env, spec, 8888);
    ASSERT_FALSE(resolved.ok()) << spec;
    EXPECT_TRUE(absl::IsInvalidArgument(resolved.status())) << resolved.status();
    EXPECT_NE(resolved.status().message().find(message), std::string::npos) << resolved.status();
  }
}

// Starts `shoal <args>` with SLURM's variables for rank `rank` of `env`.
pid_t StartWithSlurm(const SlurmEnvironment& env, int rank, const std::vector<std::string>& args,
                     const fs::path& output) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("SLURM_PROCID", std::to_string(rank).c_str(), 1);
    setenv("SLURM_STEP_NUM_TASKS", env.num_tasks.c_str(), 1);
    setenv("SLURM_STEP_NODELIST", env.nodelist.c_str(), 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", env.tasks_per_node.c_str(), 1);
    unsetenv("TF_CONFIG");
    if (std::freopen(output.c_str(), "w", stdout) == nullptr || std::freopen(output.c_str(), "a", stderr) == nullptr) {
      _exit(126);
    }
    ExecShoal(args);
  }
  return pid;
}

std::string Slurp(const fs::path& file) {
  std::ifstream in(file);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Three tasks, as `srun -n 3 shoal worker --slurm ps:1,worker:2` starts
// them: one per loopback "node" (127.0.0.1-3, one port for all). The ps
// serves, the workers train, and the chief reports.
TEST(SlurmTest, AJobStartedAsSrunStartsItTrains) {
  const fs::path dir = FreshTempDir("shoal_slurm_", "job");
  JobConfig config = QuickJob("async");
  config.training.max_steps = 60;
  std::ofstream(dir / "config.yaml") << JobConfigToYaml(config);
  const int port = FreeLoopbackPorts(1).value()[0];
  const SlurmEnvironment env{"", "3", "127.0.0.[1-3]", "1(x3)"};
  const std::vector<std::string> args = {"worker", "--slurm", "ps:1,worker:2", "--port_base", std::to_string(port),
                                         "--config", (dir / "config.yaml").string(), "--quiet",
                                         "--result_file", (dir / "result.json").string()};

  // `shoal resolve` says what each rank would be.
  std::vector<std::string> resolve = {"resolve", "--slurm", "ps:1,worker:2", "--port_base", std::to_string(port)};
  ASSERT_EQ(WaitFor(StartWithSlurm(env, 1, resolve, dir / "resolve.txt"), absl::Seconds(30)), 0)
      << Slurp(dir / "resolve.txt");
  EXPECT_NE(Slurp(dir / "resolve.txt")
                .find("task /job:worker/task:0 trains (the chief) at 127.0.0.2:" + std::to_string(port)),
            std::string::npos)
      << Slurp(dir / "resolve.txt");

  std::vector<pid_t> pids;
  for (int rank = 0; rank < 3; ++rank) {
    pids.push_back(StartWithSlurm(env, rank, args, dir / ("rank_" + std::to_string(rank) + ".txt")));
  }
  for (int rank = 0; rank < 3; ++rank) {
    const int status = WaitFor(pids[rank], absl::Seconds(120));
    EXPECT_EQ(status, 0) << "rank " << rank << ": " << Slurp(dir / ("rank_" + std::to_string(rank) + ".txt"));
  }
  auto report = ReportFromJson(nlohmann::json::parse(Slurp(dir / "result.json")));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_GE(report->global_step, 60);
  EXPECT_LE(report->global_step, 61);  // async: the other worker's last push may land after the 60th
  EXPECT_GT(report->test_accuracy, 0.5);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shoal
