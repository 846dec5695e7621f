#include "shoal/cluster/cluster_spec.h"

#include <gtest/gtest.h>

namespace shoal {
namespace {

TEST(ClusterSpecTest, ParsesClusterFileJson) {
  auto spec = ClusterSpec::FromJson(R"({"ps": ["a:1", "b:1"], "worker": ["c:1", "d:1", "e:1"]})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->NumTasks("ps"), 2);
  EXPECT_EQ(spec->NumTasks("worker"), 3);
  EXPECT_EQ(spec->AddressOf({"worker", 2}).value(), "e:1");
  EXPECT_EQ(spec->Chief(), (TaskId{"worker", 0}));
  EXPECT_EQ(spec->TrainingTasks().size(), 3u);
}

TEST(ClusterSpecTest, ChiefJobMakesItsTaskTheChief) {
  auto spec = ClusterSpec::FromJson(R"({"cluster": {"chief": ["x:1"], "ps": ["a:1"], "worker": ["c:1"]}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->Chief(), (TaskId{"chief", 0}));
  EXPECT_EQ(spec->TrainingTasks().size(), 2u);
}

TEST(ClusterSpecTest, RefusesInconsistentSpecs) {
  struct Case {
    const char* json;
    const char* says;
  } cases[] = {
      {R"({"ps": ["a:1"], "worker": ["a:1"]})", "duplicate address 'a:1'"},
      {R"({"ps": ["a:1"], "worker": ["b:1"], "trainer": ["c:1"]})", "unknown job 'trainer'"},
      {R"({"ps": ["a:1"], "master": ["b:1"], "chief": ["c:1"]})", "both 'master' and 'chief'"},
      {R"({"ps": ["a:1"], "worker": {"one": "b:1"}})", "task index 'one'"},
      {R"({"ps": ["a:1"], "worker": {"99999999": "b:1"}})", "task index '99999999'"},
      {R"({"ps": ["a:1"], "worker": {"1": 7}})", "task 1 has no address"},
      {R"({"worker": ["b:1"]})", "no 'ps' job"},
      {R"({"ps": [], "worker": ["b:1"]})", "job 'ps' has no tasks"},
      {R"({"ps": ["a:1"], "worker": ["b:1"], "chief": ["c:1", "d:1"]})", "exactly one task"},
      {R"({"ps": ["a:1"], "worker": [3]})", "not a string"},
      {R"({"ps": "a:1", "worker": ["b:1"]})", "as an array"},
      {R"({"ps": ["a:1"], )", "not valid JSON"},
  };
  for (const Case& c : cases) {
    auto spec = ClusterSpec::FromJson(c.json);
    ASSERT_FALSE(spec.ok()) << c.json;
    EXPECT_NE(spec.status().message().find(c.says), std::string::npos) << spec.status() << " for " << c.json;
  }
}

TEST(ClusterSpecTest, ParsesTfConfig) {
  auto config = ParseTfConfig(
      R"({"cluster": {"ps": ["a:1"], "worker": ["b:1", "c:1"]}, "task": {"type": "worker", "index": 1}})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->task, (TaskId{"worker", 1}));
  EXPECT_EQ(config->cluster.NumTasks("worker"), 2);
}

// What the Kubeflow training operator sets today: every replica type in the
// cluster (an evaluator too), "master" for the chief in older TFJobs, and
// the sparse form that lists only some workers.
TEST(ClusterSpecTest, ParsesTheTfConfigsOfTodaysTfJobs) {
  auto with_evaluator = ParseTfConfig(
      R"({"cluster": {"chief": ["c:1"], "ps": ["a:1"], "worker": ["b:1"], "evaluator": ["e:1"]},
          "task": {"type": "evaluator", "index": 0}})");
  ASSERT_TRUE(with_evaluator.ok()) << with_evaluator.status();
  EXPECT_EQ(with_evaluator->task, (TaskId{"evaluator", 0}));
  EXPECT_EQ(with_evaluator->cluster.TrainingTasks().size(), 2u);  // the evaluator does not train

  auto master = ParseTfConfig(
      R"({"cluster": {"master": ["m:1"], "ps": ["a:1"], "worker": ["b:1"]}, "task": {"type": "master", "index": 0}})");
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_EQ(master->task, (TaskId{"chief", 0}));
  EXPECT_TRUE(master->cluster.IsChief(master->task));
  EXPECT_EQ(master->cluster.AddressOf({"chief", 0}).value(), "m:1");
  EXPECT_EQ(ParseTaskId("master:0").value(), (TaskId{"chief", 0}));

  auto sparse = ParseTfConfig(
      R"({"cluster": {"ps": ["a:1", "a:2"], "worker": {"1": "w1:1"}}, "task": {"type": "worker", "index": 1}})");
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  EXPECT_EQ(sparse->cluster.NumTasks("worker"), 2);  // worker 0 exists, somewhere
  EXPECT_EQ(sparse->cluster.AddressOf({"worker", 1}).value(), "w1:1");
  auto unknown = sparse->cluster.AddressOf({"worker", 0});
  EXPECT_TRUE(absl::IsNotFound(unknown.status()));
  EXPECT_NE(unknown.status().message().find("sparse form"), std::string::npos) << unknown.status();
  EXPECT_EQ(sparse->cluster.AllTasks().size(), 3u);  // the tasks it can reach
}

TEST(ClusterSpecTest, TfConfigIndexOutOfRangeIsRefused) {
  auto config = ParseTfConfig(R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker", "index": 4}})");
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("out of range"), std::string::npos) << config.status();
  EXPECT_FALSE(ParseTfConfig(R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}})").ok());
  EXPECT_FALSE(ParseTfConfig(R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}, "task": {"type": "ps"}})").ok());
}

TEST(ClusterSpecTest, ParsesTaskNames) {
  EXPECT_EQ(ParseTaskId("ps:1").value(), (TaskId{"ps", 1}));
  EXPECT_EQ(ParseTaskId("/job:worker/task:3").value(), (TaskId{"worker", 3}));
  EXPECT_EQ(ParseTaskId("/job:worker/replica:0/task:2").value(), (TaskId{"worker", 2}));
  EXPECT_FALSE(ParseTaskId("ps").ok());
  EXPECT_FALSE(ParseTaskId("ps:-1").ok());
  EXPECT_FALSE(ParseTaskId("gpu:1").ok());
  EXPECT_EQ(TaskId({"ps", 1}).ToString(), "/job:ps/task:1");
}

TEST(ClusterSpecTest, JsonRoundTrip) {
  ClusterSpec spec = ClusterSpec::Local(2, 3, 5000);
  auto again = ClusterSpec::FromJson(spec.ToJson());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->jobs(), spec.jobs());
}

TEST(ClusterSpecTest, OnlyLoopbackAddressesCountAsLoopback) {
  for (const char* address : {"127.0.0.1:2222", "127.3.4.5:1", "localhost:2222", "[::1]:2222"}) {
    EXPECT_TRUE(IsLoopbackAddress(address)) << address;
  }
  for (const char* address : {"0.0.0.0:2222", "10.0.0.1:2222", "[::]:2222", "ps-0.shoal:2222", "128.0.0.1:1",
                              "127.0.0.1.evil.example:2222"}) {
    EXPECT_FALSE(IsLoopbackAddress(address)) << address;
  }
}

TEST(ClusterSpecTest, TwoNamesForOneAddressAreADuplicate) {
  auto aliased = ClusterSpec::Create({{"ps", {"localhost:2222"}}, {"worker", {"127.0.0.1:2222"}}});
  EXPECT_EQ(aliased.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(aliased.status().message().find("duplicate address '127.0.0.1:2222' for /job:ps/task:0 and "
                                            "/job:worker/task:0"),
            std::string::npos)
      << aliased.status();
  EXPECT_FALSE(ClusterSpec::Create({{"ps", {"PS-0:1"}}, {"worker", {"ps-0:1"}}}).ok());
  EXPECT_TRUE(ClusterSpec::Create({{"ps", {"localhost:2222"}}, {"worker", {"127.0.0.1:2223"}}}).ok());
}

}  // namespace
// Without a token, a shutdown is taken only from the hosts of the job's tasks.
TEST(ClusterSpecTest, APeerIsOfTheJobWhenItIsOnOneOfItsHosts) {
  const ClusterSpec local = ClusterSpec::FromJson(R"({"ps": ["127.0.0.1:1"], "worker": ["localhost:2"]})").value();
  EXPECT_TRUE(IsPeerOfJob("ipv4:127.0.0.1:41234", local));
  EXPECT_TRUE(IsPeerOfJob("ipv6:[::1]:41234", local));
  EXPECT_FALSE(IsPeerOfJob("ipv4:10.9.8.7:41234", local));
  const ClusterSpec remote = ClusterSpec::FromJson(R"({"ps": ["10.9.8.7:1"], "worker": ["10.9.8.6:2"]})").value();
  EXPECT_TRUE(IsPeerOfJob("ipv4:10.9.8.6:5000", remote));
  EXPECT_TRUE(IsPeerOfJob("ipv6:[::ffff:10.9.8.7]:5000", remote));
  EXPECT_FALSE(IsPeerOfJob("ipv4:127.0.0.1:5000", remote));  // this machine is none of the job's hosts
  EXPECT_FALSE(IsPeerOfJob("ipv4:10.9.8.5:5000", remote));
}

}  // namespace shoal
