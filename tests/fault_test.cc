// Faults with real processes and signals: the local launcher's children are
// killed with SIGKILL while a job runs; a worker is restarted within the
// restart budget and the job accounts for every step, a spent budget or a
// dead ps stops the job naming the task.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>

#include "quick_job.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/session/local_cluster.h"

namespace shoal {
namespace {

// A child of this process whose command line contains `needle` (the
// launcher's children are ours), waiting up to 30 s for it; -1 if none.
pid_t FindChild(const std::string& needle, pid_t not_this = -1) {
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (absl::Now() < give_up) {
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      const std::string name = entry.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream stat(entry.path() / "stat");
      std::string line;
      std::getline(stat, line);
      const size_t paren = line.rfind(')');
      if (paren == std::string::npos) continue;
      std::istringstream rest(line.substr(paren + 2));
      std::string state;
      pid_t parent = 0;
      rest >> state >> parent;
      if (parent != getpid()) continue;
      std::ifstream cmdline(entry.path() / "cmdline");
      std::string args((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
      std::replace(args.begin(), args.end(), '\0', ' ');
      const pid_t pid = std::stoi(name);
      if (args.find(needle) != std::string::npos && pid != not_this) return pid;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return -1;
}

// Waits up to 60 s for the job to have saved a checkpoint under `dir`.
bool WaitForACheckpoint(const std::string& dir) {
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (!LatestCheckpoint(dir).ok() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(100));
  return LatestCheckpoint(dir).ok();
}

JobConfig LongAsyncJob(int max_restarts) {
  JobConfig config = QuickJob();
  config.training.max_steps = 1200;  // about 15 s over processes: time to kill one
  config.cluster.max_restarts = max_restarts;
  return config;
}

TEST(FaultTest, AWorkerKilledMidJobIsRestartedAndEveryStepIsAccountedFor) {
  auto job = std::async(std::launch::async, [] {
    return TrainInLocalProcesses(LongAsyncJob(1), SHOAL_BINARY, /*show_progress=*/false);
  });
  const pid_t worker = FindChild("--task /job:worker/task:1");
  ASSERT_GT(worker, 0);
  absl::SleepFor(absl::Seconds(4));  // well into training
  ASSERT_EQ(kill(worker, SIGKILL), 0);
  auto report = job.get();
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->restarts.size(), 1u);
  EXPECT_NE(report->restarts[0].find("/job:worker/task:1 was killed by signal 9, restarted (1 of 1)"),
            std::string::npos)
      << report->restarts[0];
  EXPECT_GE(report->global_step, 1200);  // every step applied and counted
  EXPECT_GT(report->test_accuracy, 0.75);
}

TEST(FaultTest, ASpentRestartBudgetStopsTheJobWithAReport) {
  auto job = std::async(std::launch::async, [] {
    return TrainInLocalProcesses(LongAsyncJob(1), SHOAL_BINARY, /*show_progress=*/false);
  });
  const pid_t first = FindChild("--task /job:worker/task:1");
  ASSERT_GT(first, 0);
  absl::SleepFor(absl::Seconds(2));
  ASSERT_EQ(kill(first, SIGKILL), 0);
  const pid_t second = FindChild("--task /job:worker/task:1", first);
  ASSERT_GT(second, 0);
  absl::SleepFor(absl::Seconds(1));
  ASSERT_EQ(kill(second, SIGKILL), 0);
  auto report = job.get();
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("the restart budget (cluster.max_restarts = 1) is spent"),
            std::string::npos)
      << report.status();
  EXPECT_NE(report.status().message().find("/job:worker/task:1 was killed by signal 9"), std::string::npos)
      << report.status();
}

// With checkpoints a killed ps task is started again, empty; the workers
// see it unreachable, then without its variables, and wait; the chief
// restores the newest checkpoint onto every task and training goes on.
TEST(FaultTest, AKilledPsIsRestartedAndRestoredFromTheLastCheckpoint) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("shoal_fault_ckpt_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(dir);
  JobConfig config = LongAsyncJob(1);
  config.checkpoint.dir = dir;
  config.checkpoint.every_steps = 100;
  auto job = std::async(std::launch::async, [&] {
    return TrainInLocalProcesses(config, SHOAL_BINARY, /*show_progress=*/false);
  });
  const pid_t ps = FindChild("--task /job:ps/task:1");
  ASSERT_GT(ps, 0);
  // Kill it once a checkpoint exists.
  ASSERT_TRUE(WaitForACheckpoint(dir));
  ASSERT_EQ(kill(ps, SIGKILL), 0);
  auto report = job.get();
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->restarts.size(), 1u);
  EXPECT_NE(report->restarts[0].find("/job:ps/task:1 was killed by signal 9"), std::string::npos);
  ASSERT_GE(report->recoveries.size(), 1u);
  EXPECT_NE(report->recoveries[0].find("restored " + dir), std::string::npos) << report->recoveries[0];
  EXPECT_GE(report->global_step, 1200);
  EXPECT_GT(report->test_accuracy, 0.75);
  std::filesystem::remove_all(dir);
}

// The chief killed and started again. With restore: if_lost it finds the
// variables live on the ps tasks (newer than any checkpoint) and goes on
// from them; with restore: always it rolls them back to the newest
// checkpoint, as TensorFlow's chief does. Either way the job goes on.
TEST(FaultTest, AKilledChiefIsRestartedAndTheJobGoesOn) {
  for (const std::string restore : {"if_lost", "always"}) {
    const std::string dir = (std::filesystem::temp_directory_path() /
                             ("shoal_fault_chief_" + restore + "_" + std::to_string(getpid()))).string();
    std::filesystem::remove_all(dir);
    JobConfig config = LongAsyncJob(1);
    config.checkpoint.dir = dir;
    config.checkpoint.every_steps = 100;
    config.checkpoint.restore = restore;
    auto job = std::async(std::launch::async, [&] {
      return TrainInLocalProcesses(config, SHOAL_BINARY, /*show_progress=*/false);
    });
    const pid_t chief = FindChild("--task /job:worker/task:0");
    ASSERT_GT(chief, 0) << restore;
    WaitForACheckpoint(dir);
    ASSERT_EQ(kill(chief, SIGKILL), 0);
    auto report = job.get();
    ASSERT_TRUE(report.ok()) << restore << ": " << report.status();
    ASSERT_EQ(report->restarts.size(), 1u) << restore;
    EXPECT_NE(report->restarts[0].find("/job:worker/task:0 was killed by signal 9"), std::string::npos);
    if (restore == "if_lost") {
      EXPECT_TRUE(report->restored_from.empty());  // the ps tasks kept the newer live values
    } else {
      EXPECT_NE(report->restored_from.find(dir), std::string::npos) << report->restored_from;
    }
    EXPECT_GE(report->global_step, 1200) << restore;
    EXPECT_GT(report->test_accuracy, 0.75) << restore;
    std::filesystem::remove_all(dir);
  }
}

TEST(FaultTest, AKilledPsStopsTheJobNamingIt) {
  auto job = std::async(std::launch::async, [] {
    return TrainInLocalProcesses(LongAsyncJob(3), SHOAL_BINARY, /*show_progress=*/false);
  });
  const pid_t ps = FindChild("--task /job:ps/task:1");
  ASSERT_GT(ps, 0);
  absl::SleepFor(absl::Seconds(3));
  ASSERT_EQ(kill(ps, SIGKILL), 0);
  auto report = job.get();  // without checkpoints a ps is not restarted: it would come back empty
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("/job:ps/task:1 was killed by signal 9"), std::string::npos)
      << report.status();
}

}  // namespace
}  // namespace shoal
