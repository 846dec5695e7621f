#include "shoal/placement/placement.h"

#include <gtest/gtest.h>

#include <set>

namespace shoal {
namespace {

const ClusterSpec kCluster = ClusterSpec::Local(3, 4);

std::vector<VariableSpec> Mlp() {
  return {{"dense_1/kernel", {784, 256}}, {"dense_1/bias", {256}}, {"dense_2/kernel", {256, 128}},
          {"dense_2/bias", {128}},         {"dense_3/kernel", {128, 10}}, {"dense_3/bias", {10}}};
}

TEST(PlacementTest, RoundRobinFollowsCreationOrder) {
  auto placement = Placement::Create(Mlp(), kCluster, {});
  ASSERT_TRUE(placement.ok());
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(placement->Locate(Mlp()[i].name)->shards[0].task, (TaskId{"ps", i % 3})) << i;
  }
}

TEST(PlacementTest, GreedyBalancesBytes) {
  PlacementOptions options;
  options.strategy = "greedy";
  auto placement = Placement::Create(Mlp(), kCluster, options);
  ASSERT_TRUE(placement.ok());
  // The big kernel takes ps:0; everything else goes to the lighter tasks.
  EXPECT_EQ(placement->Locate("dense_1/kernel")->shards[0].task, (TaskId{"ps", 0}));
  EXPECT_EQ(placement->Locate("dense_1/bias")->shards[0].task, (TaskId{"ps", 1}));
  EXPECT_EQ(placement->Locate("dense_2/kernel")->shards[0].task, (TaskId{"ps", 2}));
  auto bytes = placement->BytesPerTask();
  EXPECT_EQ((bytes[TaskId{"ps", 0}]), 784u * 256 * 4);
}

TEST(PlacementTest, ScopeRulesWinAndLocateOtherMembersVariables) {
  PlacementOptions options;
  options.scope_rules.push_back(ParseScopeRule("worker_3/*=/job:worker/task:3").value());
  auto placement = Placement::Create({{"worker_3/dense_1/kernel", {4, 4}}, {"shared", {4}}}, kCluster, options);
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->Locate("worker_3/dense_1/kernel")->shards[0].task, (TaskId{"worker", 3}));
  EXPECT_EQ(placement->Locate("shared")->shards[0].task, (TaskId{"ps", 0}));
  // A variable created elsewhere under a ruled scope is still found.
  EXPECT_EQ(placement->Locate("worker_3/other")->shards[0].task, (TaskId{"worker", 3}));
  EXPECT_EQ(placement->Locate("unknown").status().code(), absl::StatusCode::kNotFound);
}

TEST(PlacementTest, PartitionsLargeVariablesIntoRowSlices) {
  PlacementOptions options;
  options.min_partition_bytes = 100 * 1024;
  auto placement = Placement::Create(Mlp(), kCluster, options);
  ASSERT_TRUE(placement.ok());
  auto kernel = placement->Locate("dense_1/kernel").value();
  ASSERT_EQ(kernel.shards.size(), 3u);
  EXPECT_EQ(kernel.shards[0].stored_name, "dense_1/kernel/part_0");
  EXPECT_EQ(kernel.shards[0].row_end - kernel.shards[0].row_begin, 262);  // 784 = 262 + 261 + 261
  EXPECT_EQ(kernel.shards[2].row_end, 784);
  std::set<TaskId> tasks;
  for (const Shard& s : kernel.shards) tasks.insert(s.task);
  EXPECT_EQ(tasks.size(), 3u);
  EXPECT_EQ(placement->Locate("dense_1/bias")->shards.size(), 1u);
}

TEST(PlacementTest, RefusesBadOptions) {
  PlacementOptions options;
  options.strategy = "random";
  EXPECT_FALSE(Placement::Create(Mlp(), kCluster, options).ok());
  PlacementOptions rule;
  rule.scope_rules.push_back({"x/*", {"worker", 9}});
  EXPECT_FALSE(Placement::Create(Mlp(), kCluster, rule).ok());
  EXPECT_FALSE(ParseScopeRule("no-equals").ok());
  EXPECT_FALSE(Placement::Create({{"a", {1}}, {"a", {1}}}, kCluster, {}).ok());
}

}  // namespace
}  // namespace shoal
