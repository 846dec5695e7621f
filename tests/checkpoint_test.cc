// Checkpoints: CRC32C, the shard format and its corruption cases, saving a
// cluster and restoring it onto another number of ps tasks, which checkpoint
// counts as the latest, pruning, and a job that resumes where it stopped.
#include "shoal/checkpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <future>

#include "inproc_servers.h"
#include "quick_job.h"
#include "step_recorder.h"
#include "temp_dir.h"
#include "shoal/checkpoint/saver_hook.h"
#include "shoal/core/crc32c.h"
#include "shoal/server/variable_service.h"
#include "shoal/session/local_cluster.h"
#include "shoal/session/task_runner.h"
#include "shoal/transport/inproc/inproc_transport.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;

fs::path TempDir(const std::string& name) { return FreshTempDir("shoal_ckpt_", name); }

void FlipByte(const fs::path& file, size_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x20));
}

TEST(Crc32cTest, MatchesTheKnownValueAndCanBeContinued) {
  const std::string text = "123456789";
  EXPECT_EQ(Crc32c(text.data(), text.size()), 0xE3069283u);
  EXPECT_EQ(Crc32c(text.data() + 4, 5, Crc32c(text.data(), 4)), 0xE3069283u);
  std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
}

// The crc32 instruction's path (where the CPU has it) and the tables agree
// on every length and alignment, and when continued.
TEST(Crc32cTest, TheInstructionAndTheTablesAgree) {
  std::vector<unsigned char> bytes(300);
  uint32_t x = 12345;
  for (unsigned char& b : bytes) b = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 16);
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t size = 0; size + offset <= bytes.size(); size += 7) {
      EXPECT_EQ(Crc32c(bytes.data() + offset, size), Crc32cPortable(bytes.data() + offset, size))
          << "offset " << offset << " size " << size;
      EXPECT_EQ(Crc32c(bytes.data() + offset, size, 0xDEADBEEFu), Crc32cPortable(bytes.data() + offset, size, 0xDEADBEEFu));
    }
  }
  const std::string text = "123456789";
  EXPECT_EQ(Crc32cPortable(text.data(), text.size()), 0xE3069283u);
}

std::vector<SavedVariable> TwoVariables() {
  torch::manual_seed(3);
  SavedVariable a{"dense_1/kernel", "adam", torch::randn({5, 3}), {{torch::randn({5, 3}), torch::rand({5, 3})}, 17}};
  SavedVariable b{"dense_1/bias", "sgd", torch::randn({3}), {}};
  return {a, b};
}

TEST(CheckpointShardTest, RoundTripsValuesAndSlotsBitForBit) {
  const fs::path dir = TempDir("roundtrip");
  const std::string path = (dir / "shard-0.ckpt").string();
  const auto saved = TwoVariables();
  ASSERT_TRUE(WriteShard(path, saved).ok());
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  auto read = ReadShard(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ((*read)[i].name, saved[i].name);
    EXPECT_EQ((*read)[i].optimizer, saved[i].optimizer);
    EXPECT_TRUE((*read)[i].value.equal(saved[i].value));
    EXPECT_EQ((*read)[i].slots.step, saved[i].slots.step);
    ASSERT_EQ((*read)[i].slots.tensors.size(), saved[i].slots.tensors.size());
    for (size_t j = 0; j < saved[i].slots.tensors.size(); ++j) {
      EXPECT_TRUE((*read)[i].slots.tensors[j].equal(saved[i].slots.tensors[j]));
    }
  }
  fs::remove_all(dir);
}

TEST(CheckpointShardTest, Int64BuffersRoundTripAtTheirDtype) {
  const fs::path dir = TempDir("int64");
  const std::string path = (dir / "shard-0.ckpt").string();
  const torch::Tensor count = torch::tensor({(int64_t{1} << 40) + 3, int64_t{-2}});
  ASSERT_TRUE(WriteShard(path, {{"bn/num_batches_tracked", "", count, {}}, TwoVariables()[0]}).ok());
  auto read = ReadShard(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ((*read)[0].value.scalar_type(), torch::kInt64);
  EXPECT_TRUE((*read)[0].value.equal(count));
  EXPECT_EQ((*read)[1].value.scalar_type(), torch::kFloat32);
  EXPECT_FALSE(WriteShard(path, {{"x", "", torch::ones({2}, torch::kFloat64), {}}}).ok());
  fs::remove_all(dir);
}

TEST(CheckpointShardTest, CorruptionIsDataLossNamingTheFileAndTheVariable) {
  const fs::path dir = TempDir("corrupt");
  const fs::path path = dir / "shard-0.ckpt";
  ASSERT_TRUE(WriteShard(path.string(), TwoVariables()).ok());
  const size_t size = fs::file_size(path);

  // A byte in the last tensor's data (the bias value, near the end).
  fs::copy_file(path, dir / "flipped.ckpt");
  FlipByte(dir / "flipped.ckpt", size - 20);
  auto flipped = ReadShard((dir / "flipped.ckpt").string());
  EXPECT_EQ(flipped.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(flipped.status().message().find("flipped.ckpt"), std::string::npos) << flipped.status();
  EXPECT_NE(flipped.status().message().find("variable 'dense_1/bias'"), std::string::npos) << flipped.status();

  // A byte in the first record's header.
  fs::copy_file(path, dir / "header.ckpt");
  FlipByte(dir / "header.ckpt", 26);
  auto header = ReadShard((dir / "header.ckpt").string());
  EXPECT_EQ(header.status().code(), absl::StatusCode::kDataLoss) << header.status();

  // Cut short, and not a shard at all.
  fs::copy_file(path, dir / "short.ckpt");
  fs::resize_file(dir / "short.ckpt", size / 2);
  auto truncated = ReadShard((dir / "short.ckpt").string());
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos) << truncated.status();
  std::ofstream(dir / "text.ckpt") << "not a checkpoint at all";
  EXPECT_EQ(ReadShard((dir / "text.ckpt").string()).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadShard((dir / "missing.ckpt").string()).status().code(), absl::StatusCode::kNotFound);
  fs::remove_all(dir);
}

JobConfig WithCheckpointDir(const fs::path& dir) {
  JobConfig config = DefaultJobConfig();
  config.checkpoint.dir = dir.string();
  return config;
}

// `ps` ps tasks in this process, writing checkpoints into `dir`, with a
// client placed over `specs`.
struct SmallCluster {
  SmallCluster(int ps, const std::vector<VariableSpec>& specs, const PlacementOptions& options, const fs::path& dir)
      : cluster(ClusterSpec::Local(ps, 1)), servers(WithCheckpointDir(dir), cluster) {
    auto placement = std::make_shared<const Placement>(Placement::Create(specs, cluster, options).value());
    client = Client::Create(cluster, &servers.transport, placement).value();
  }
  ClusterSpec cluster;
  InProcServers servers;
  std::unique_ptr<Client> client;
};

// Stops task `index` of the cluster (in AllTasks order) and starts a fresh
// one at its address: a restarted process, holding nothing.
void Restart(SmallCluster& small, size_t index, const fs::path& dir) {
  const TaskId task = small.cluster.AllTasks()[index];
  small.servers.servers[index].reset();
  small.servers.services[index] = MakeVariableService(WithCheckpointDir(dir), task);
  small.servers.servers[index] =
      small.servers.transport.Serve(small.cluster.AddressOf(task).value(), small.servers.services[index].get()).value();
}

wire::OptimizerConfig Sgd() {
  wire::OptimizerConfig sgd;
  sgd.set_kind("sgd");
  sgd.set_learning_rate(0.1);
  return sgd;
}

TEST(CheckpointTest, RestoresOntoAnotherNumberOfPsTasksWithTheSlots) {
  const fs::path dir = TempDir("replace");
  const std::vector<VariableSpec> specs = {{"big", {64, 8}}, {"small", {8}}, {"other", {4, 4}}};
  const std::vector<std::string> names = {"big", "small", "other"};
  wire::OptimizerConfig adam;
  adam.set_kind("adam");
  std::vector<VariableInit> inits;
  torch::manual_seed(1);
  for (const auto& spec : specs) inits.push_back({spec.name, torch::randn(spec.shape), adam});

  // Two ps tasks, "big" whole; train a few steps so the slots are not zero.
  SmallCluster two(2, specs, {}, dir);
  ASSERT_TRUE(two.client->CreateVariables(inits).ok());
  for (int step = 0; step < 3; ++step) {
    std::vector<torch::Tensor> grads;
    for (const auto& spec : specs) grads.push_back(torch::randn(spec.shape));
    ASSERT_TRUE(two.client->ApplyGradients(names, grads).ok());
  }
  auto saved_path = SaveCheckpoint(*two.client, dir.string(), 3);
  ASSERT_TRUE(saved_path.ok()) << saved_path.status();
  auto saved = LoadCheckpoint(*saved_path);
  ASSERT_TRUE(saved.ok()) << saved.status();

  // Three ps tasks, "big" split into row slices across them.
  PlacementOptions partitioned;
  partitioned.min_partition_bytes = 1024;
  SmallCluster three(3, specs, partitioned, dir / "again");
  ASSERT_TRUE(three.client->placement().Locate("big")->partitioned());
  std::vector<VariableInit> zeros = inits;
  for (auto& init : zeros) init.value = torch::zeros_like(init.value);
  ASSERT_TRUE(three.client->CreateVariables(zeros).ok());
  auto selected = SelectVariables(*saved, names, {{64, 8}, {8}, {4, 4}}, *saved_path);
  ASSERT_TRUE(selected.ok()) << selected.status();
  ASSERT_TRUE(RestoreVariables(*three.client, *selected, names).ok());

  // What the three tasks now hold, saved again, is what the two held.
  auto again_path = SaveCheckpoint(*three.client, (dir / "again").string(), 3);
  ASSERT_TRUE(again_path.ok()) << again_path.status();
  auto index = ReadCheckpointIndex(*again_path);
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(index->shards.size(), 3u);
  auto again = SelectVariables(LoadCheckpoint(*again_path).value(), names, {{64, 8}, {8}, {4, 4}}, *again_path);
  ASSERT_TRUE(again.ok()) << again.status();
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_TRUE((*again)[i].value.equal((*selected)[i].value)) << names[i];
    EXPECT_EQ((*again)[i].slots.step, 3) << names[i];
    ASSERT_EQ((*again)[i].slots.tensors.size(), 2u) << names[i];
    for (size_t j = 0; j < 2; ++j) EXPECT_TRUE((*again)[i].slots.tensors[j].equal((*selected)[i].slots.tensors[j]));
    EXPECT_GT((*selected)[i].slots.tensors[1].abs().sum().item<double>(), 0) << names[i];
  }
  // A model that does not match the checkpoint is refused, naming why.
  EXPECT_EQ(SelectVariables(*saved, {"missing"}, {{1}}, *saved_path).status().code(), absl::StatusCode::kNotFound);
  auto wrong = SelectVariables(*saved, {"small"}, {{9}}, *saved_path);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("'small'"), std::string::npos) << wrong.status();
  fs::remove_all(dir);
}

TEST(CheckpointTest, AnUnfinishedCheckpointIsNeverTheLatestAndPruningKeepsTheNewest) {
  const fs::path dir = TempDir("latest");
  const std::vector<VariableSpec> specs = {{"w", {4}}};
  SmallCluster cluster(1, specs, {}, dir);
  wire::OptimizerConfig sgd;
  sgd.set_kind("sgd");
  ASSERT_TRUE(cluster.client->CreateVariables({{"w", torch::ones({4}), sgd}}).ok());
  for (int64_t step : {10, 20, 30}) ASSERT_TRUE(SaveCheckpoint(*cluster.client, dir.string(), step).ok());
  // A save cut short: its shard is there, its index is not.
  fs::create_directories(dir / "ckpt-40");
  fs::copy_file(dir / "ckpt-30" / "shard-0.ckpt", dir / "ckpt-40" / "shard-0.ckpt");
  EXPECT_EQ(LatestCheckpoint(dir.string()).value(), (dir / "ckpt-30").string());
  // A corrupt index is damage, not a save cut short: DATA_LOSS naming the
  // file, unless the caller asks to fall back to the newest intact one.
  fs::create_directories(dir / "ckpt-50");
  std::ofstream(dir / "ckpt-50" / "index.json") << "{\"format_version\": 1, \"step\": ";
  auto corrupt = LatestCheckpoint(dir.string());
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(corrupt.status().message().find((dir / "ckpt-50" / "index.json").string() + "' is corrupt"),
            std::string::npos)
      << corrupt.status();
  EXPECT_NE(corrupt.status().message().find("checkpoint.on_corrupt: fall_back"), std::string::npos);
  EXPECT_EQ(LatestCheckpoint(dir.string(), /*fall_back_past_corrupt=*/true).value(), (dir / "ckpt-30").string());

  ASSERT_TRUE(PruneCheckpoints(dir.string(), 2).ok());
  std::vector<int64_t> left;
  for (const auto& c : ListCheckpoints(dir.string())) left.push_back(c.step);
  // Kept: the two newest complete ones, and the unfinished ones newer than them.
  EXPECT_EQ(left, (std::vector<int64_t>{20, 30, 40, 50}));
  EXPECT_EQ(LatestCheckpoint((dir / "none").string()).status().code(), absl::StatusCode::kNotFound);
  fs::remove_all(dir);
}

// A checkpoint keeps the job's counters, so that a lost counter task gets
// them back; an index written before counters were kept still reads.
TEST(CheckpointTest, ACheckpointKeepsTheJobsCountersAndOlderIndexesStillRead) {
  const fs::path dir = TempDir("counters");
  SmallCluster cluster(1, {{"w", {4}}}, {}, dir);
  wire::OptimizerConfig sgd;
  sgd.set_kind("sgd");
  ASSERT_TRUE(cluster.client->CreateVariables({{"w", torch::ones({4}), sgd}}).ok());
  ASSERT_TRUE(cluster.client->AddToCounter("workers_done", 2).ok());
  ASSERT_TRUE(cluster.client->AddToCounter("bytes_sent", 12345).ok());
  auto saved = SaveCheckpoint(*cluster.client, dir.string(), 7, {"workers_done", "bytes_sent", "never_touched"});
  ASSERT_TRUE(saved.ok()) << saved.status();
  const CheckpointIndex index = ReadCheckpointIndex(*saved).value();
  EXPECT_EQ(index.counters, (std::map<std::string, int64_t>{{"bytes_sent", 12345}, {"never_touched", 0},
                                                            {"workers_done", 2}}));
  // The same index without its counters (as written before they were kept).
  nlohmann::json older = nlohmann::json::parse(std::ifstream(fs::path(*saved) / "index.json"));
  older.erase("counters");
  std::ofstream(fs::path(*saved) / "index.json") << older.dump();
  auto reread = ReadCheckpointIndex(*saved);
  ASSERT_TRUE(reread.ok()) << reread.status();
  EXPECT_TRUE(reread->counters.empty());
  EXPECT_EQ(reread->step, 7);
  // Setting a counter is one operation, whatever it held.
  EXPECT_EQ(cluster.client->SetCounter("global_step", 100).value(), 100);
  EXPECT_EQ(cluster.client->SetCounter("global_step", 40).value(), 40);
  EXPECT_EQ(cluster.client->AddToCounter("global_step", 0).value(), 40);
  fs::remove_all(dir);
}

// The attack: a peer asks a ps to write a shard over a file of its choosing
// (the old request carried a path). The server writes only inside its own
// checkpoint directory, under names it builds from numbers.
TEST(CheckpointTest, AServerWritesShardsOnlyInsideItsCheckpointDirectory) {
  const fs::path dir = TempDir("confined");
  const fs::path victim = dir / "victim.txt";
  std::ofstream(victim) << "precious";
  auto save = [](VariableService& service, int64_t step, int shard, const std::string& smuggled_path) {
    Request request;
    request.header.mutable_save_shard()->set_step(step);
    request.header.mutable_save_shard()->set_shard(shard);
    // What an old client or an attacker puts in field 1: now an unknown field.
    request.header.mutable_save_shard()->GetReflection()->MutableUnknownFields(
        request.header.mutable_save_shard())->AddLengthDelimited(1, smuggled_path);
    Response response;
    service.Handle(request, &response);
    return std::make_pair(ResponseStatus(response.header), response.header.save_shard().path());
  };
  wire::VariableDef def;
  def.set_name("../../victim.txt");  // attacker-chosen text in a variable name changes nothing either
  def.add_shape(2);
  def.mutable_optimizer()->set_kind("sgd");

  VariableService without_dir(VariableServiceOptions{"/job:ps/task:0"});
  ASSERT_TRUE(without_dir.store().Create({def}, {torch::ones({2})}).ok());
  auto [refused, nowhere] = save(without_dir, 7, 0, victim.string());
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("without a checkpoint directory"), std::string::npos) << refused;

  VariableService with_dir(VariableServiceOptions{"/job:ps/task:0", 1 << 20, (dir / "checkpoints").string()});
  ASSERT_TRUE(with_dir.store().Create({def}, {torch::ones({2})}).ok());
  auto [saved, path] = save(with_dir, 7, 3, victim.string());
  ASSERT_TRUE(saved.ok()) << saved;
  EXPECT_EQ(path, fs::absolute(dir / "checkpoints" / "ckpt-7" / "shard-3.ckpt").string());
  EXPECT_TRUE(fs::exists(path));
  EXPECT_EQ(save(with_dir, -1, 0, "").first.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(save(with_dir, 1, -5, "").first.code(), absl::StatusCode::kInvalidArgument);

  std::ifstream in(victim);
  std::string contents((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(contents, "precious");
  std::vector<std::string> entries;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) entries.push_back(fs::relative(entry.path(), dir));
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"checkpoints", "checkpoints/ckpt-7", "checkpoints/ckpt-7/shard-3.ckpt",
                                                "victim.txt"}));
  fs::remove_all(dir);
}

// A task started again in the same place is a new incarnation: it answers
// with another number, and a client that knew the old one counts a restart.
TEST(CheckpointTest, ARestartedServerIsANewIncarnation) {
  const ClusterSpec cluster = ClusterSpec::Local(1, 1);
  const std::vector<VariableSpec> specs = {{"w", {2}}};
  auto placement = std::make_shared<const Placement>(Placement::Create(specs, cluster, {}).value());
  InProcNetwork network;
  InProcTransport transport(&network);
  const std::string address = cluster.AddressOf(TaskId{"ps", 0}).value();
  auto client = Client::Create(cluster, &transport, placement).value();
  wire::OptimizerConfig sgd;
  sgd.set_kind("sgd");
  VariableService first(VariableServiceOptions{"/job:ps/task:0"});
  {
    auto server = transport.Serve(address, &first).value();
    ASSERT_TRUE(client->CreateVariables({{"w", torch::ones({2}), sgd}}).ok());
    ASSERT_TRUE(client->Read({"w"}).ok());
  }
  EXPECT_EQ(client->restarts_seen(), 0);
  VariableService second(VariableServiceOptions{"/job:ps/task:0"});
  EXPECT_NE(first.incarnation(), second.incarnation());
  auto server = transport.Serve(address, &second).value();
  // The new process holds nothing: a read is NOT_FOUND, never fresh values.
  EXPECT_EQ(client->Read({"w"}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->restarts_seen(), 1);
}

// A ps task restarted while a checkpoint is saved answers from its new
// process: what it wrote (a restore's older values, beside the other tasks'
// live ones) must not become a checkpoint, even when it holds every
// variable it should.
TEST(CheckpointTest, ACheckpointSavedAcrossAPsRestartIsLeftUnfinished) {
  const fs::path dir = TempDir("restarted");
  const std::vector<VariableSpec> specs = {{"a", {4}}, {"b", {4}}};
  SmallCluster small(2, specs, {}, dir);
  ASSERT_TRUE(small.client->CreateVariables({{"a", torch::ones({4}), Sgd()}, {"b", torch::ones({4}), Sgd()}}).ok());
  ASSERT_TRUE(small.client->Read({"a", "b"}).ok());
  const TaskId ps1{"ps", 1};
  const std::string on_ps1 = small.client->placement().Locate("a")->shards[0].task == ps1 ? "a" : "b";
  Restart(small, 1, dir);
  // Another worker (or a restore) makes ps:1's variable again before the
  // chief's save reaches it.
  auto other = Client::Create(small.cluster, &small.servers.transport,
                              std::make_shared<const Placement>(small.client->placement()))
                   .value();
  ASSERT_TRUE(other->CreateVariables({{on_ps1, torch::zeros({4}), Sgd()}}).ok());

  auto saved = SaveCheckpoint(*small.client, dir.string(), 5);
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kFailedPrecondition) << saved.status();
  EXPECT_NE(saved.status().message().find("a task restarted while it was saved"), std::string::npos)
      << saved.status();
  EXPECT_EQ(LatestCheckpoint(dir.string()).status().code(), absl::StatusCode::kNotFound);
  // The next save, with the restart behind it, is a checkpoint.
  EXPECT_TRUE(SaveCheckpoint(*small.client, dir.string(), 6).ok());
  fs::remove_all(dir);
}

// Every ps task holds a shard of each embedding table: a save in which one
// holds none (restarted, not restored yet) would lose its rows.
TEST(CheckpointTest, APsTaskThatLostItsTablesLeavesTheCheckpointUnfinished) {
  const fs::path dir = TempDir("lost_tables");
  SmallCluster small(2, {{"w", {4}}}, {}, dir);
  ASSERT_TRUE(small.client->CreateVariables({{"w", torch::ones({4}), Sgd()}}).ok());
  wire::TableDef table;
  table.set_name("clicks");
  table.set_rows(100);
  table.set_dim(4);
  table.set_seed(7);
  *table.mutable_optimizer() = Sgd();
  ASSERT_TRUE(small.client->CreateTables({table}).ok());
  ASSERT_TRUE(SaveCheckpoint(*small.client, dir.string(), 1).ok());
  Restart(small, 1, dir);
  if (small.client->placement().Locate("w")->shards[0].task == TaskId{"ps", 1}) {
    ASSERT_TRUE(small.client->CreateVariables({{"w", torch::ones({4}), Sgd()}}).ok());
  }
  // The chief has heard from the new ps:1 (and seen it lacks the table).
  ASSERT_EQ(small.client->Occupancy("clicks").status().code(), absl::StatusCode::kNotFound);

  auto saved = SaveCheckpoint(*small.client, dir.string(), 2);
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kFailedPrecondition) << saved.status();
  EXPECT_NE(saved.status().message().find("/job:ps/task:1 holds no embedding table"), std::string::npos)
      << saved.status();
  EXPECT_EQ(LatestCheckpoint(dir.string()).value(), (fs::absolute(dir) / "ckpt-1").string());
  fs::remove_all(dir);
}

TEST(CheckpointTest, ACheckpointBeingRestoredIsNeverPruned) {
  const fs::path dir = TempDir("in_use");
  SmallCluster small(1, {{"w", {4}}}, {}, dir);
  ASSERT_TRUE(small.client->CreateVariables({{"w", torch::ones({4}), Sgd()}}).ok());
  for (int64_t step : {10, 20, 30}) ASSERT_TRUE(SaveCheckpoint(*small.client, dir.string(), step).ok());
  auto steps_left = [&] {
    std::vector<int64_t> left;
    for (const auto& c : ListCheckpoints(dir.string())) left.push_back(c.step);
    return left;
  };
  {
    const CheckpointInUse restoring((dir / "ckpt-10").string());
    EXPECT_TRUE(CheckpointInUse::Held((fs::absolute(dir) / "." / "ckpt-10").string()));
    ASSERT_TRUE(PruneCheckpoints(dir.string(), 1).ok());
    EXPECT_EQ(steps_left(), (std::vector<int64_t>{10, 30}));
  }
  EXPECT_FALSE(CheckpointInUse::Held((dir / "ckpt-10").string()));
  ASSERT_TRUE(PruneCheckpoints(dir.string(), 1).ok());
  EXPECT_EQ(steps_left(), (std::vector<int64_t>{30}));
  // As a recovery takes it: the newest, marked before it is read.
  auto held = HoldLatestCheckpoint(dir.string());
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ((*held)->path(), (dir / "ckpt-30").string());
  ASSERT_TRUE(SaveCheckpoint(*small.client, dir.string(), 40).ok());
  ASSERT_TRUE(PruneCheckpoints(dir.string(), 1).ok());
  EXPECT_EQ(steps_left(), (std::vector<int64_t>{30, 40}));
  held->reset();
  ASSERT_TRUE(PruneCheckpoints(dir.string(), 1).ok());
  EXPECT_EQ(steps_left(), (std::vector<int64_t>{40}));
  fs::remove_all(dir);
}

// In the background, a save does not hold up the chief's steps: here ps:0's
// save is held at its tables' checkpoint lock, and the chief's hook still
// returns at once. One save at a time; one due meanwhile starts once the
// first is in. Without the background, the step waits for the save.
TEST(CheckpointSaverHookTest, InTheBackgroundTheChiefTrainsOnWhileASaveIsWritten) {
  const fs::path dir = TempDir("background");
  SmallCluster small(1, {{"w", {4}}}, {}, dir);
  ASSERT_TRUE(small.client->CreateVariables({{"w", torch::ones({4}), Sgd()}}).ok());
  CheckpointConfig config;
  config.dir = dir.string();
  config.every_steps = 10;
  StopRequest stop;
  auto step = [](int64_t global_step) {
    StepInfo info;
    info.global_step = global_step;
    return info;
  };
  const TableStore& ps0_tables = small.servers.services[0]->tables();
  {
    CheckpointSaverHook saver(small.client.get(), config, {}, /*background=*/true);
    ASSERT_TRUE(saver.AfterStep(step(1), &stop).ok());
    std::unique_lock<std::mutex> held = ps0_tables.LockForCheckpoint();
    auto stepped = std::async(std::launch::async, [&] { return saver.AfterStep(step(11), &stop); });
    const bool returned = stepped.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    EXPECT_TRUE(returned) << "the chief's step waited for the save";
    EXPECT_EQ(saver.saved(), 0);
    ASSERT_TRUE(saver.AfterStep(step(25), &stop).ok());  // due, but one is being written
    held.unlock();
    if (returned) ASSERT_TRUE(stepped.get().ok());
    // The chief's steps go on; the first that finds step 11's save ended
    // collects it and starts the one due.
    for (const absl::Time give_up = absl::Now() + absl::Seconds(30); saver.saved() == 0 && absl::Now() < give_up;) {
      ASSERT_TRUE(saver.AfterStep(step(26), &stop).ok());
      if (saver.saved() == 0) absl::SleepFor(absl::Milliseconds(5));
    }
    saver.End(step(26), absl::OkStatus());
    EXPECT_EQ(saver.saved(), 2);
    EXPECT_GT(saver.seconds_saving(), 0);
  }
  std::vector<int64_t> steps;
  for (const auto& c : ListCheckpoints(dir.string())) {
    EXPECT_TRUE(c.complete) << c.path;
    steps.push_back(c.step);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{11, 26}));

  CheckpointSaverHook waits(small.client.get(), config, {}, /*background=*/false);
  ASSERT_TRUE(waits.AfterStep(step(30), &stop).ok());
  std::unique_lock<std::mutex> held = ps0_tables.LockForCheckpoint();
  auto stepped = std::async(std::launch::async, [&] { return waits.AfterStep(step(40), &stop); });
  EXPECT_EQ(stepped.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  held.unlock();
  ASSERT_TRUE(stepped.get().ok());
  EXPECT_EQ(waits.saved(), 1);
  EXPECT_GT(waits.seconds_waited(), 0.2);
  fs::remove_all(dir);
}

// A job stopped early (a hook, a signal) saves its checkpoint with the stop
// flag raised; started again, it is a new session: it restores the values
// and the global step but not the old session's counters, and trains on
// instead of stopping at once (or not waiting for workers "done" before).
TEST(CheckpointTrainingTest, AJobStoppedEarlyTrainsOnWhenStartedAgain) {
  const fs::path dir = TempDir("stopped");
  JobConfig config = QuickJob("async");
  config.data.train_examples = 3000;
  config.training.max_steps = 60;
  config.hooks.stop_at_step = 20;
  config.checkpoint.dir = dir.string();
  auto first = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_FALSE(first->stop_reason.empty());
  const CheckpointIndex saved = ReadCheckpointIndex(first->last_checkpoint).value();
  ASSERT_GE(saved.counters.at("stop_requested"), 1);  // what a restore must not bring back
  ASSERT_EQ(saved.counters.at("workers_done"), 2);
  ASSERT_LT(saved.step, 60);

  config.hooks.stop_at_step = 0;
  auto second = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->restored_from, first->last_checkpoint);
  EXPECT_TRUE(second->stop_reason.empty()) << second->stop_reason;
  EXPECT_GE(second->global_step, 60);
  EXPECT_EQ(second->worker_steps, second->global_step - saved.step);  // every worker finished its part
  fs::remove_all(dir);
}

class DataPositionTest : public ::testing::TestWithParam<std::string> {};

// A job started again over a checkpoint reads its data on from where the
// checkpoint left it, in every mode on the step driver: one pass over a log
// stays one pass. The shard of 100 examples in batches of 30 ends each
// epoch with a batch of 10, which shows where in its epoch a step is.
TEST_P(DataPositionTest, AJobStartedAgainReadsOnFromWhereItsCheckpointLeftIt) {
  const fs::path dir = TempDir("position_" + GetParam());
  JobConfig config = QuickJob(GetParam());
  config.cluster.workers = 1;
  config.data.train_examples = 100;
  config.training.batch_size = 30;
  config.training.max_steps = 5;  // 30, 30, 30, 10 | 30: 130 examples drawn
  config.local.n_fetch = config.local.n_push = config.local.interval_steps = config.local.tau = 1;
  config.checkpoint.dir = dir.string();
  const std::string position = DataPositionCounter(0, 1);
  std::vector<std::vector<int64_t>> sizes;
  auto first = TrainRecordingBatchSizes(config, &sizes);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(sizes[0], (std::vector<int64_t>{30, 30, 30, 10, 30}));
  EXPECT_EQ(ReadCheckpointIndex(first->last_checkpoint).value().counters.at(position), 130);

  config.training.max_steps = 9;
  auto second = TrainRecordingBatchSizes(config, &sizes);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->restored_from, first->last_checkpoint);
  EXPECT_EQ(sizes[0], (std::vector<int64_t>{30, 30, 10, 30}));  // from the first one's 130th example on
  EXPECT_EQ(ReadCheckpointIndex(second->last_checkpoint).value().counters.at(position), 230);

  // Other data (the next day's log; here 80 examples: 30, 30, 20) starts
  // afresh: not 230 examples in, which would draw 30, 20 first.
  config.data.train_examples = 80;
  config.training.max_steps = 12;
  auto third = TrainRecordingBatchSizes(config, &sizes);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->restored_from, second->last_checkpoint);
  EXPECT_EQ(sizes[0], (std::vector<int64_t>{30, 30, 20}));
  EXPECT_EQ(ReadCheckpointIndex(third->last_checkpoint).value().counters.at(position), 80);

  // Another worker count shards the data otherwise (40 examples each: 30,
  // 10): each worker starts its shard afresh.
  config.cluster.workers = 2;
  config.training.max_steps = 14;
  auto fourth = TrainRecordingBatchSizes(config, &sizes);
  ASSERT_TRUE(fourth.ok()) << fourth.status();
  EXPECT_EQ(fourth->restored_from, third->last_checkpoint);
  for (int w = 0; w < 2; ++w) {
    ASSERT_FALSE(sizes[w].empty()) << "worker " << w;
    EXPECT_EQ(sizes[w][0], 30) << "worker " << w;
  }
  const CheckpointIndex index = ReadCheckpointIndex(fourth->last_checkpoint).value();
  for (int w = 0; w < 2; ++w) EXPECT_GT(index.counters.at(DataPositionCounter(w, 2)), 0) << "worker " << w;
  EXPECT_EQ(index.counters.count(position), 0u);  // the job's own workers' only
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Modes, DataPositionTest,
                         ::testing::Values("async", "sync", "ssp", "downpour", "model_average", "easgd"));

TEST(CheckpointTrainingTest, AJobStartedAgainResumesFromItsLastCheckpoint) {
  const fs::path dir = TempDir("resume");
  JobConfig config = QuickJob("sync");
  config.data.train_examples = 3000;
  config.training.max_steps = 40;
  config.checkpoint.dir = dir.string();
  config.checkpoint.every_steps = 15;
  auto first = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->restored_from.empty());
  EXPECT_EQ(first->last_checkpoint, (fs::absolute(dir) / "ckpt-40").string());
  std::vector<int64_t> steps;
  for (const auto& c : ListCheckpoints(dir.string())) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{15, 30, 40}));
  EXPECT_EQ(first->checkpoints_saved, 2);  // 15 and 30; 40 is the final one
  EXPECT_GT(first->checkpoint_seconds, 0);

  // Started again with a longer budget: it goes on from step 40.
  config.training.max_steps = 80;
  auto second = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->restored_from, (fs::absolute(dir) / "ckpt-40").string());
  EXPECT_EQ(second->global_step, 80);
  EXPECT_GE(second->test_accuracy, first->test_accuracy - 0.02);
  EXPECT_GT(second->test_accuracy, 0.6);

  // A corrupt latest checkpoint stops the job instead of training afresh.
  FlipByte(fs::path(second->last_checkpoint) / "shard-0.ckpt", 200);
  config.training.max_steps = 100;
  config.transport.startup_timeout_s = 120;  // the other workers must not wait this out for the failed chief
  const absl::Time start = absl::Now();
  auto third = TrainInProcess(config, InProcOptions{}, nullptr);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "the job waited out its start-up timeout";
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kDataLoss) << third.status();
  EXPECT_NE(third.status().message().find("ckpt-80"), std::string::npos) << third.status();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shoal
