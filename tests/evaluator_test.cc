// The evaluator task, as a TFJob's evaluator replica runs it: a cluster
// whose TF_CONFIG names an evaluator starts on every task, and the
// evaluator evaluates each checkpoint, the chief's last one included.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "process_helpers.h"
#include "quick_job.h"
#include "shoal/session/evaluator.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;

std::vector<nlohmann::json> JsonLines(const fs::path& file) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line, nullptr, false));
  return lines;
}

// A job of a ps, 2 workers and an evaluator as processes; with `listed`
// the cluster every task sees names the evaluator (the chief then ends it),
// else it is left out, as the training operator's TF_CONFIG leaves it (the
// evaluator ends once it has evaluated the job's last step). With `leased`
// the job trains its 2 epochs on leased data, and ends when they are over,
// at a step no one knew beforehand.
void RunJobWithEvaluator(bool listed, bool leased = false) {
  const fs::path checkpoints =
      fs::temp_directory_path() / ("shoal_evaluator_ckpt_" + std::to_string(getpid()) + (listed ? "" : "_unlisted") +
                                   (leased ? "_leased" : ""));
  fs::remove_all(checkpoints);
  JobConfig config = QuickJob();
  config.training.max_steps = 300;
  config.checkpoint.dir = checkpoints.string();
  config.checkpoint.every_steps = 100;
  config.checkpoint.keep = 10;
  if (leased) {
    config.data.leases = true;
    config.training.max_steps = 0;
  }
  const std::string name = std::string(listed ? "shoal_evaluator" : "shoal_evaluator_unlisted") + (leased ? "_leased" : "");
  ProcessCluster cluster(name, 1, 2, config, /*spare_ports=*/1);
  if (listed) {
    nlohmann::json spec = nlohmann::json::parse(cluster.ReadFile("cluster.json"));
    spec["evaluator"] = {"127.0.0.1:" + std::to_string(cluster.spare_port(0))};
    std::ofstream(cluster.dir() / "cluster.json") << spec.dump();
  }

  const pid_t evaluator = cluster.Start("evaluator", "evaluator:0", "evaluator.err");
  const pid_t ps = cluster.Start("server", "ps:0", "ps.err");
  const pid_t chief = cluster.Start("worker", "worker:0", "chief.err");
  const pid_t worker = cluster.Start("worker", "worker:1", "worker1.err");
  const int chief_status = WaitFor(chief, absl::Seconds(120));
  const int worker_status = WaitFor(worker, absl::Seconds(30));
  const int evaluator_status = WaitFor(evaluator, absl::Seconds(60));
  WaitFor(ps, absl::Seconds(30));
  for (pid_t pid : {chief, worker, ps, evaluator}) kill(pid, SIGKILL);
  EXPECT_EQ(chief_status, 0) << cluster.ReadFile("chief.err");
  EXPECT_EQ(worker_status, 0) << cluster.ReadFile("worker1.err");
  EXPECT_EQ(evaluator_status, 0) << cluster.ReadFile("evaluator.err");

  const nlohmann::json result = nlohmann::json::parse(cluster.ReadFile("worker:0.json"), nullptr, false);
  ASSERT_FALSE(result.is_discarded()) << cluster.ReadFile("chief.err");
  const std::vector<nlohmann::json> lines = JsonLines(cluster.dir() / "metrics" / "evaluator_0.jsonl");
  ASSERT_FALSE(lines.empty()) << cluster.ReadFile("evaluator.err");
  int64_t previous = -1;
  for (const auto& line : lines) {
    ASSERT_FALSE(line.is_discarded());
    EXPECT_EQ(line["task"], "/job:evaluator/task:0");
    EXPECT_GT(line["global_step"].get<int64_t>(), previous);  // each checkpoint once, in order
    previous = line["global_step"].get<int64_t>();
    EXPECT_GT(line["test_loss"].get<double>(), 0);
  }
  EXPECT_GT(lines.back()["test_accuracy"].get<double>(), 0.6);
  if (listed || leased) {
    // The last line is the chief's final checkpoint: the values the chief
    // itself evaluated, on the same test set. (An unlisted evaluator of a
    // leased job knows it by its lease table: the job's epochs finished.)
    EXPECT_EQ(lines.back()["global_step"].get<int64_t>(), result["global_step"].get<int64_t>());
    EXPECT_NEAR(lines.back()["test_accuracy"].get<double>(), result["test_accuracy"].get<double>(), 1e-9);
  } else {
    EXPECT_GE(lines.back()["global_step"].get<int64_t>(), 300);  // the job's last step, or the one after
  }
  fs::remove_all(checkpoints);
}

TEST(EvaluatorTest, AnEvaluatorTaskEvaluatesEveryCheckpointUpToTheLast) { RunJobWithEvaluator(/*listed=*/true); }

TEST(EvaluatorTest, AnEvaluatorLeftOutOfTheClusterStopsAfterTheLastStep) { RunJobWithEvaluator(/*listed=*/false); }

TEST(EvaluatorTest, AnEvaluatorLeftOutOfAJobOnLeasedDataStopsAfterTheCheckpointThatEndsTheData) {
  RunJobWithEvaluator(/*listed=*/false, /*leased=*/true);
}

TEST(EvaluatorTest, AnEvaluatorNeedsCheckpointsAndOneModel) {
  JobConfig config = QuickJob();
  absl::Status no_checkpoints = CheckEvaluatorConfig(config);
  EXPECT_EQ(no_checkpoints.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(no_checkpoints.message().find("checkpoint.dir"), std::string::npos) << no_checkpoints;
  config.checkpoint.dir = "/tmp/somewhere";
  EXPECT_TRUE(CheckEvaluatorConfig(config).ok());
  config.training.mode = "population";
  EXPECT_NE(CheckEvaluatorConfig(config).message().find("mode 'population'"), std::string::npos);
}

}  // namespace
}  // namespace shoal
