// Embedding tables in checkpoints: each ps task streams its table shards to
// tables-<n>.ckpt, and any number of ps tasks restores them row for row,
// slots included; a corrupt or mismatched file changes no table.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "inproc_servers.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/server/table_checkpoint.h"
#include "shoal/session/local_cluster.h"
#include "temp_dir.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;

// `ps` in-process ps tasks that keep checkpoints in `dir`, and a client.
struct PsTasks {
  PsTasks(int ps, const fs::path& dir)
      : config(Config(ps, dir)), cluster(ClusterSpec::Local(ps, 1)), servers(config, cluster) {
    // No variables: the tables are all there is.
    auto placement = std::make_shared<const Placement>(Placement::Create({}, cluster, PlacementOptions{}).value());
    client = Client::Create(cluster, &servers.transport, placement).value();
  }
  static JobConfig Config(int ps, const fs::path& dir) {
    JobConfig config;
    config.cluster.ps = ps;
    config.checkpoint.dir = dir.string();
    return config;
  }
  JobConfig config;
  ClusterSpec cluster;
  InProcServers servers;
  std::unique_ptr<Client> client;
};

wire::TableDef Table(const std::string& name, int64_t rows, int64_t dim, const std::string& optimizer) {
  wire::TableDef def;
  def.set_name(name);
  def.set_rows(rows);
  def.set_dim(dim);
  def.set_seed(7);
  def.set_init_scale(0.1);
  def.mutable_optimizer()->set_kind(optimizer);
  def.mutable_optimizer()->set_learning_rate(0.1);
  return def;
}

torch::Tensor Ids(std::vector<int64_t> ids) { return torch::tensor(ids); }

// A fixed table trained by Adagrad and a dynamic one by LazyAdam.
std::vector<wire::TableDef> TwoTables() {
  return {Table("fixed", 1000, 4, "adagrad"), Table("dynamic", 0, 3, "lazy_adam")};
}

const std::vector<int64_t> kFixedIds = {0, 1, 2, 3, 10, 11, 99, 500, 998, 999};
const std::vector<int64_t> kDynamicIds = {-5, 3, int64_t{1} << 40, 77, 12345};

// Trains both tables a little: three pushes of fixed gradients.
void Train(Client& client) {
  for (int step = 0; step < 3; ++step) {
    const float g = 0.5f + step;
    ASSERT_TRUE(client.PushRows("fixed", Ids(kFixedIds), torch::full({10, 4}, g)).ok());
    ASSERT_TRUE(client.PushRows("dynamic", Ids(kDynamicIds), torch::full({5, 3}, -g)).ok());
  }
}

// Both tables' rows of the ids above, as `a` and `b` hold them, are equal
// (to float rounding, after an optimizer's steps on different shard counts).
void ExpectSameRows(Client& a, Client& b) {
  for (const auto& [table, ids] : {std::pair{"fixed", kFixedIds}, std::pair{"dynamic", kDynamicIds}}) {
    EXPECT_TRUE(torch::allclose(a.PullRows(table, Ids(ids)).value(), b.PullRows(table, Ids(ids)).value(), 1e-6, 1e-7))
        << table;
  }
}

TEST(TableCheckpointTest, TablesTwoPsTasksSavedRestoreOntoThreeRowForRowWithTheirSlots) {
  const fs::path dir = FreshTempDir("shoal_tables_", "two_to_three");
  const std::vector<wire::TableDef> defs = TwoTables();
  PsTasks two(2, dir);
  ASSERT_TRUE(two.client->CreateTables(defs).ok());
  Train(*two.client);
  auto saved = SaveCheckpoint(*two.client, dir.string(), 3);
  ASSERT_TRUE(saved.ok()) << saved.status();
  const CheckpointIndex index = ReadCheckpointIndex(*saved).value();
  EXPECT_EQ(index.table_shards, (std::vector<int>{0, 1}));
  EXPECT_TRUE(fs::exists(fs::path(*saved) / TableFileName(1)));

  PsTasks three(3, dir);
  ASSERT_TRUE(three.client->CreateTables(defs).ok());
  auto rows = three.client->RestoreTables(3, index.table_shards);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, 1000 + 5);  // every fixed row, and the dynamic rows pushes made
  ExpectSameRows(*three.client, *two.client);
  // The slots came too (Adagrad's accumulator, LazyAdam's moments and push
  // count): one more step lands both clusters on the same rows.
  Train(*two.client);
  Train(*three.client);
  ExpectSameRows(*three.client, *two.client);
}

TEST(TableCheckpointTest, AFlippedByteOrAnotherWidthIsRefusedAndChangesNoTable) {
  const fs::path dir = FreshTempDir("shoal_tables_", "refused");
  const std::vector<wire::TableDef> defs = TwoTables();
  PsTasks two(2, dir);
  ASSERT_TRUE(two.client->CreateTables(defs).ok());
  Train(*two.client);
  const std::string saved = SaveCheckpoint(*two.client, dir.string(), 3).value();

  PsTasks wider(2, dir);
  ASSERT_TRUE(wider.client->CreateTables({Table("fixed", 1000, 5, "adagrad"), defs[1]}).ok());
  const torch::Tensor untouched = wider.client->PullRows("fixed", Ids(kFixedIds)).value();
  absl::StatusOr<int64_t> refused = wider.client->RestoreTables(3, {0, 1});
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("rows are 4 wide, the table's 5"), std::string::npos) << refused.status();
  EXPECT_TRUE(wider.client->PullRows("fixed", Ids(kFixedIds)).value().equal(untouched));

  // A byte flipped in the last chunk of one file: refused naming the file;
  // the other file's rows, checked first, are not restored either.
  const fs::path file = fs::path(saved) / TableFileName(1);
  {
    std::fstream bytes(file, std::ios::in | std::ios::out | std::ios::binary);
    bytes.seekp(static_cast<std::streamoff>(fs::file_size(file) - 40));
    bytes.put('\x5a');
  }
  PsTasks same(2, dir);
  ASSERT_TRUE(same.client->CreateTables(defs).ok());
  const torch::Tensor fresh = same.client->PullRows("fixed", Ids(kFixedIds)).value();
  refused = same.client->RestoreTables(3, {0, 1});
  EXPECT_TRUE(absl::IsDataLoss(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find(TableFileName(1)), std::string::npos) << refused.status();
  EXPECT_TRUE(same.client->PullRows("fixed", Ids(kFixedIds)).value().equal(fresh));
  // A table the checkpoint names that this job lacks: NotFound naming it.
  PsTasks other(1, dir);
  ASSERT_TRUE(other.client->CreateTables({Table("other", 10, 4, "adagrad")}).ok());
  refused = other.client->RestoreTables(3, {0});
  EXPECT_TRUE(absl::IsNotFound(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("table 'dynamic' not found"), std::string::npos) << refused.status();
}

// A dynamic table is restored only if its rows fit under its bound, here a
// max_rows below what was saved: refused naming the figures, and nothing
// (the fixed table in the same files included) changes.
TEST(TableCheckpointTest, ADynamicTableWithoutRoomForTheCheckpointsRowsIsRefused) {
  const fs::path dir = FreshTempDir("shoal_tables_", "no_room");
  const std::vector<wire::TableDef> defs = TwoTables();
  PsTasks one(1, dir);
  ASSERT_TRUE(one.client->CreateTables(defs).ok());
  Train(*one.client);  // the dynamic table makes a row for each of its 5 ids
  ASSERT_TRUE(SaveCheckpoint(*one.client, dir.string(), 3).ok());

  wire::TableDef small = defs[1];
  small.set_max_rows(4);
  PsTasks smaller(1, dir);
  ASSERT_TRUE(smaller.client->CreateTables({defs[0], small}).ok());
  const torch::Tensor fresh = smaller.client->PullRows("fixed", Ids(kFixedIds)).value();
  absl::StatusOr<int64_t> refused = smaller.client->RestoreTables(3, {0});
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("table 'dynamic' on /job:ps/task:0: the checkpoint brings 5 rows to "
                                            "this shard, more than the 4 it may hold"),
            std::string::npos)
      << refused.status();
  EXPECT_TRUE(smaller.client->PullRows("fixed", Ids(kFixedIds)).value().equal(fresh));
  EXPECT_EQ(smaller.client->Occupancy("dynamic").value().rows_held, 0);

  small.set_max_rows(5);  // room for every row: restored
  PsTasks enough(1, dir);
  ASSERT_TRUE(enough.client->CreateTables({defs[0], small}).ok());
  auto rows = enough.client->RestoreTables(3, {0});
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, 1000 + 5);
  ExpectSameRows(*enough.client, *one.client);
}

// An evaluator's copy: read-only tables take the rows of an Adagrad and a
// LazyAdam checkpoint without their slots, and refuse pushes unchanged.
TEST(TableCheckpointTest, ReadOnlyTablesRestoreAnyOptimizersRowsAndRefusePushes) {
  const fs::path dir = FreshTempDir("shoal_tables_", "read_only");
  std::vector<wire::TableDef> defs = TwoTables();
  PsTasks two(2, dir);
  ASSERT_TRUE(two.client->CreateTables(defs).ok());
  Train(*two.client);
  ASSERT_TRUE(SaveCheckpoint(*two.client, dir.string(), 3).ok());

  for (wire::TableDef& def : defs) def.set_read_only(true);
  PsTasks reader(1, dir);
  ASSERT_TRUE(reader.client->CreateTables(defs).ok());
  auto rows = reader.client->RestoreTables(3, {0, 1});
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, 1000 + 5);
  ExpectSameRows(*reader.client, *two.client);
  const torch::Tensor restored = reader.client->PullRows("fixed", Ids(kFixedIds)).value();
  absl::StatusOr<int64_t> refused = reader.client->PushRows("fixed", Ids(kFixedIds), torch::ones({10, 4}));
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("table 'fixed'"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("read-only"), std::string::npos) << refused.status();
  EXPECT_TRUE(reader.client->PullRows("fixed", Ids(kFixedIds)).value().equal(restored));
}

// A restored dynamic table goes on as the saved one would: each row keeps
// how long ago a push last touched it (steps_to_live) and how many pushes
// touched it (eviction lfu), so the same pushes after the restore expire
// and evict the same rows. (Before, restored rows counted as touched once,
// at push 0: the first expiry sweep after a restore dropped them all, and
// LFU forgot which rows were used most.)
TEST(TableCheckpointTest, RestoredRowsKeepTheirAgeAndTouchCounts) {
  const fs::path dir = FreshTempDir("shoal_tables_", "row_stats");
  wire::TableDef expiring = Table("expiring", 0, 2, "sgd");
  expiring.set_steps_to_live(40);
  wire::TableDef frequent = Table("frequent", 0, 2, "sgd");
  frequent.set_max_rows(32);
  frequent.set_evict_when_full(true);
  frequent.set_eviction("lfu");
  const std::vector<int64_t> hot_ids = {1000, 1001, 1002, 1003, 1004}, warm_ids = {500, 501, 502, 503};
  // Push `step` brings a new id to each table, and one of five hot ids to
  // the expiring one; the first ten bring four warm ids to the LFU one,
  // which no push touches later. Each push moves a row by -0.1.
  auto push = [&](Client& client, int64_t step) {
    ASSERT_TRUE(client.PushRows("expiring", Ids({step, hot_ids[step % 5]}), torch::ones({2, 2})).ok()) << step;
    std::vector<int64_t> ids = {step};
    if (step < 10) ids.insert(ids.end(), warm_ids.begin(), warm_ids.end());
    const auto n = static_cast<int64_t>(ids.size());
    ASSERT_TRUE(client.PushRows("frequent", Ids(ids), torch::ones({n, 2})).ok()) << step;
  };
  std::vector<int64_t> every_id;
  for (int64_t id = 0; id < 100; ++id) every_id.push_back(id);
  every_id.insert(every_id.end(), hot_ids.begin(), hot_ids.end());
  every_id.insert(every_id.end(), warm_ids.begin(), warm_ids.end());
  auto rows_of = [&](Client& client, const std::string& table) {
    return client.PullRows(table, Ids(every_id)).value();
  };
  PsTasks saved(1, dir);
  ASSERT_TRUE(saved.client->CreateTables({expiring, frequent}).ok());
  for (int64_t step = 0; step < 50; ++step) push(*saved.client, step);
  ASSERT_TRUE(SaveCheckpoint(*saved.client, dir.string(), 50).ok());

  PsTasks restored(1, dir);
  ASSERT_TRUE(restored.client->CreateTables({expiring, frequent}).ok());
  auto rows = restored.client->RestoreTables(50, {0});
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, saved.client->Occupancy("expiring").value().rows_held +
                       saved.client->Occupancy("frequent").value().rows_held);
  // Onto two tasks, each shard's rows keep their age in pushes too.
  PsTasks two(2, dir);
  ASSERT_TRUE(two.client->CreateTables({expiring, frequent}).ok());
  ASSERT_TRUE(two.client->RestoreTables(50, {0}).ok());
  for (int64_t step = 50; step < 100; ++step) {
    push(*saved.client, step);
    push(*restored.client, step);
    push(*two.client, step);
    // Expiry is exact; which of the rows of one age and count an LFU sweep
    // takes first follows where they lie in the table, so there the count
    // held is compared.
    ASSERT_TRUE(rows_of(*restored.client, "expiring").equal(rows_of(*saved.client, "expiring")))
        << "after push " << step << ", the rows held and expired differ";
    ASSERT_EQ(restored.client->Occupancy("frequent").value().rows_held,
              saved.client->Occupancy("frequent").value().rows_held)
        << step;
  }
  // Here and on two tasks, the hot ids (touched lately) and the warm ones
  // (touched most) were never dropped: about -2 and -1 from initial rows
  // in [-0.1, 0.1].
  for (Client* client : {saved.client.get(), restored.client.get(), two.client.get()}) {
    const torch::Tensor hot = client->PullRows("expiring", Ids(hot_ids)).value();
    EXPECT_TRUE(hot.lt(-1.8).all().item<bool>()) << hot;
    const torch::Tensor warm = client->PullRows("frequent", Ids(warm_ids)).value();
    EXPECT_TRUE(warm.lt(-0.8).all().item<bool>()) << warm;
  }
  fs::remove_all(dir);
}

// Ids pushed fewer than min_count times are saved with their counts and
// ages (sightings), so a restored table admits them when the saved one
// would, not after min_count more pushes; onto two tasks too.
TEST(TableCheckpointTest, IdsSeenBelowMinCountAreRememberedThroughARestore) {
  const fs::path dir = FreshTempDir("shoal_tables_", "sightings");
  wire::TableDef admitting = Table("admitting", 0, 2, "sgd");
  admitting.set_min_count(3);
  admitting.set_steps_to_live(8);
  PsTasks saved(1, dir);
  ASSERT_TRUE(saved.client->CreateTables({admitting}).ok());
  // 7 seen twice, 8 once, 9 three times (a row), 10 twice but long ago.
  for (const std::vector<int64_t>& ids : std::vector<std::vector<int64_t>>{{10}, {10}, {1}, {2}, {3}, {9}, {7, 9},
                                                                           {7, 8, 9}}) {
    ASSERT_TRUE(saved.client->PushRows("admitting", Ids(ids), torch::ones({static_cast<int64_t>(ids.size()), 2})).ok());
  }
  ASSERT_TRUE(SaveCheckpoint(*saved.client, dir.string(), 8).ok());
  PsTasks restored(1, dir), two(2, dir);
  for (PsTasks* tasks : {&restored, &two}) {
    ASSERT_TRUE(tasks->client->CreateTables({admitting}).ok());
    auto rows = tasks->client->RestoreTables(8, {0});
    ASSERT_TRUE(rows.ok()) << rows.status();
    EXPECT_EQ(*rows, 1);  // 9: sightings are not rows
  }
  // One more push of 7 and 8 admits 7 (its third), not 8 (its second).
  for (PsTasks* tasks : {&saved, &restored, &two}) {
    ASSERT_TRUE(tasks->client->PushRows("admitting", Ids({7, 8}), torch::ones({2, 2})).ok());
  }
  const torch::Tensor ids = Ids({7, 8, 9});
  const torch::Tensor expected = saved.client->PullRows("admitting", ids).value();
  EXPECT_EQ(saved.client->Occupancy("admitting").value().rows_held, 2);  // 7, 9
  for (PsTasks* tasks : {&restored, &two}) {
    EXPECT_EQ(tasks->client->Occupancy("admitting").value().rows_held, 2);
    EXPECT_TRUE(tasks->client->PullRows("admitting", ids).value().equal(expected)) << "7 admitted, 8 not";
  }
  // 10's sightings kept their age: they expire at push 12 (10 pushes old),
  // so 10 pushed again starts counting afresh (a shard's pushes count those
  // that reach it, so this is followed on one task).
  for (PsTasks* tasks : {&saved, &restored}) {
    for (int step = 0; step < 4; ++step) {
      ASSERT_TRUE(tasks->client->PushRows("admitting", Ids({1}), torch::ones({1, 2})).ok());
    }
    ASSERT_TRUE(tasks->client->PushRows("admitting", Ids({10}), torch::ones({1, 2})).ok());
    EXPECT_EQ(tasks->client->Occupancy("admitting").value().rows_held, 3);  // 1, 7, 9; not 10
  }
  fs::remove_all(dir);
}

// A checkpoint restored onto live tables puts them back to it, as it does
// the variables: rows made since go (an empty table's too), and a full
// evict_when_full table takes the checkpoint's rows, which with the rows it
// holds would not fit. (Before, the restore was refused, and a job whose
// ps task was lost could not go on.)
TEST(TableCheckpointTest, ARestoreOntoLiveTablesPutsThemBackToTheCheckpoint) {
  const fs::path dir = FreshTempDir("shoal_tables_", "onto_live");
  wire::TableDef full = Table("full", 0, 2, "adagrad");
  full.set_max_rows(32);
  full.set_evict_when_full(true);
  const wire::TableDef empty = Table("empty", 0, 2, "adagrad");
  std::vector<int64_t> every_id;
  for (int64_t id = 0; id < 70; ++id) every_id.push_back(id);
  PsTasks live(1, dir);
  ASSERT_TRUE(live.client->CreateTables({full, empty}).ok());
  auto push = [&](int64_t id) {
    ASSERT_TRUE(live.client->PushRows("full", Ids({id}), torch::ones({1, 2})).ok()) << id;
  };
  for (int64_t id = 0; id < 50; ++id) push(id);
  ASSERT_TRUE(SaveCheckpoint(*live.client, dir.string(), 50).ok());
  for (int64_t id = 50; id < 70; ++id) push(id);
  ASSERT_TRUE(live.client->PushRows("empty", Ids({7, 8}), torch::ones({2, 2})).ok());

  auto restored = live.client->RestoreTables(50, {0});
  ASSERT_TRUE(restored.ok()) << restored.status();
  PsTasks fresh(1, dir);
  ASSERT_TRUE(fresh.client->CreateTables({full, empty}).ok());
  ASSERT_TRUE(fresh.client->RestoreTables(50, {0}).ok());
  EXPECT_EQ(live.client->Occupancy("full").value().rows_held, fresh.client->Occupancy("full").value().rows_held);
  EXPECT_TRUE(live.client->PullRows("full", Ids(every_id)).value().equal(
      fresh.client->PullRows("full", Ids(every_id)).value()));
  EXPECT_EQ(live.client->Occupancy("empty").value().rows_held, 0);
  // Both go on alike: the push count came back too.
  for (int64_t id = 70; id < 80; ++id) {
    ASSERT_TRUE(live.client->PushRows("full", Ids({id, 49}), torch::ones({2, 2})).ok());
    ASSERT_TRUE(fresh.client->PushRows("full", Ids({id, 49}), torch::ones({2, 2})).ok());
  }
  every_id.insert(every_id.end(), {70, 75, 79});
  EXPECT_TRUE(live.client->PullRows("full", Ids(every_id)).value().equal(
      fresh.client->PullRows("full", Ids(every_id)).value()));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shoal
