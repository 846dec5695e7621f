// Embedding tables: a shard's rows from the seed, the sparse optimizers
// against their formulas, dynamic tables' admission and eviction, bad input
// refused with nothing changed, and the client's pull and push by id over
// two ps tasks.
#include "shoal/server/embedding_table.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <future>
#include <limits>
#include <set>

#include "shoal/client/client.h"
#include "shoal/server/table_checkpoint.h"
#include "shoal/server/variable_service.h"
#include "shoal/session/task_runner.h"
#include "inproc_servers.h"

namespace shoal {
namespace {

wire::TableDef Def(const std::string& kind, int64_t rows = 10, int64_t dim = 4, int shard = 0, int shards = 1) {
  wire::TableDef def;
  def.set_name("emb");
  def.set_rows(rows);
  def.set_dim(dim);
  def.set_shard(shard);
  def.set_num_shards(shards);
  def.set_seed(7);
  def.set_init_scale(0.5);
  def.mutable_optimizer()->set_kind(kind);
  def.mutable_optimizer()->set_learning_rate(0.1);
  return def;
}

torch::Tensor Ids(std::vector<int64_t> ids) { return torch::tensor(ids, torch::kInt64); }

std::unique_ptr<EmbeddingTable> Make(const wire::TableDef& def) {
  return EmbeddingTable::Create(def, "/job:ps/task:0").value();
}

TEST(RowArenaTest, GrowingKeepsRowsInPlaceAndGivesNewRowsTheFill) {
  constexpr int64_t kMoreThanAChunk = (1 << 14) + 7;  // RowArena's chunks hold 2^14 rows
  for (float fill : {0.0f, 0.25f}) {
    RowArena arena(3, fill);
    arena.Grow(5);
    float* kept = arena.Row(2);
    for (int j = 0; j < 3; ++j) kept[j] = 7.0f + j;
    arena.Grow(kMoreThanAChunk);
    arena.Grow(3);  // never shrinks
    ASSERT_EQ(arena.rows(), kMoreThanAChunk);
    EXPECT_EQ(arena.Row(2), kept) << "growing moved a row";
    for (int j = 0; j < 3; ++j) EXPECT_EQ(kept[j], 7.0f + j);
    for (int64_t row : {int64_t{0}, int64_t{4}, int64_t{5}, int64_t{1} << 14, kMoreThanAChunk - 1}) {
      for (int j = 0; j < 3; ++j) EXPECT_EQ(arena.Row(row)[j], fill) << "row " << row << " fill " << fill;
    }
  }
}

// A read-only table (an evaluator's copy) keeps no optimizer slots and
// holds only the rows restored into it, here those of two ids of a trained
// fixed table's checkpoint chunks; any other id reads as its initial row.
TEST(EmbeddingTableTest, AReadOnlyTableHoldsOnlyTheRowsRestoredIntoItWithoutSlots) {
  for (const std::string kind : {"adagrad", "lazy_adam", "ftrl"}) {
    wire::TableDef def = Def(kind, 100);
    const auto trained = Make(def);
    ASSERT_TRUE(trained->Push(Ids({0, 42, 99}), torch::ones({3, 4})).ok());
    def.set_read_only(true);
    const auto read_only = Make(def);
    EXPECT_EQ(read_only->size(), 0) << kind;
    EXPECT_EQ(read_only->bytes(), 0) << kind;
    const std::vector<int64_t> only = {0, 42};
    ASSERT_TRUE(trained
                    ->ForEachChunk(64,
                                   [&](const SavedRows& rows, int64_t pushes) {
                                     wire::TableChunk chunk;
                                     chunk.set_table("emb");
                                     chunk.set_dim(4);
                                     chunk.set_optimizer(kind);
                                     chunk.set_slots(static_cast<int>(rows.slots.size()));
                                     chunk.set_pushes(pushes);
                                     EXPECT_TRUE(read_only->CheckRestore(chunk, rows).ok()) << kind;
                                     read_only->Restore(chunk, rows, &only);
                                     return absl::OkStatus();
                                   })
                    .ok());
    EXPECT_EQ(read_only->size(), 2) << kind;
    const int64_t slot_count = kind == "adagrad" ? 1 : 2;
    EXPECT_EQ(trained->bytes(), (1 + slot_count) * read_only->bytes()) << kind;  // one chunk of values alone
    EXPECT_TRUE(read_only->Pull(Ids({0, 42})).value().equal(trained->Pull(Ids({0, 42})).value())) << kind;
    torch::Tensor initial = torch::empty({1, 4});
    EmbeddingTable::InitialRow(def, 99, initial.data_ptr<float>());
    EXPECT_TRUE(read_only->Pull(Ids({99})).value().equal(initial)) << kind;
    EXPECT_FALSE(trained->Pull(Ids({99})).value().equal(initial)) << kind;  // 99 trained, but was not restored
  }
}

// A checkpoint's walk over a table holds its lock only to copy a chunk:
// a push made while a chunk is being written goes through at once (before,
// pushes waited for the whole save, 1.8 s of a 2 s save of a 5M-row shard).
TEST(EmbeddingTableTest, PushesGoOnWhileACheckpointWritesTheTable) {
  for (const int64_t rows : {int64_t{100}, int64_t{0}}) {  // fixed, dynamic
    const auto table = Make(Def("adagrad", rows));
    ASSERT_TRUE(table->Push(Ids({1, 2, 3, 4, 5, 6}), torch::ones({6, 4})).ok());
    int chunks = 0;
    ASSERT_TRUE(table
                    ->ForEachChunk(2,
                                   [&](const SavedRows&, int64_t) {
                                     // On another thread, as a worker's push would come; the wait
                                     // is bounded, so a push that blocks fails here, not hangs.
                                     auto push = std::async(std::launch::async, [&] {
                                       return table->Push(Ids({7 + chunks}), torch::ones({1, 4})).ok();
                                     });
                                     const bool done = push.wait_for(std::chrono::seconds(30)) ==
                                                       std::future_status::ready;
                                     EXPECT_TRUE(done) << "a push waited for the save (rows " << rows << ")";
                                     ++chunks;
                                     return absl::OkStatus();  // (the future's destructor waits for the push)
                                   })
                    .ok());
    EXPECT_EQ(table->pushes(), 1 + chunks) << rows;
    EXPECT_GE(chunks, 3) << rows;
  }
}

// Rows dropped and made again while a checkpoint walks a full table that
// evicts (its ids churn all the time) never put an id in the file twice,
// which would make the restore count more rows than the table may hold;
// rows made during the walk are left out, and the file restores onto an
// empty table of the same bound.
TEST(EmbeddingTableTest, ACheckpointWalkWritesEachIdOnceWhileRowsChurn) {
  wire::TableDef def = Def("adagrad", 0);
  def.set_max_rows(32);
  def.set_evict_when_full(true);
  const auto table = Make(def);
  for (int64_t id = 0; id < 32; ++id) ASSERT_TRUE(table->Push(Ids({id}), torch::ones({1, 4})).ok());
  std::set<int64_t> held_at_start;
  for (int64_t id = 0; id < 32; ++id) held_at_start.insert(id);
  std::vector<int64_t> written;
  std::vector<std::pair<wire::TableChunk, SavedRows>> chunks;
  int64_t next_new = 1000;
  ASSERT_TRUE(table
                  ->ForEachChunk(4,
                                 [&](const SavedRows& rows, int64_t pushes) {
                                   const int64_t* id = rows.ids.data_ptr<int64_t>();
                                   std::vector<int64_t> these(id, id + rows.ids.numel());
                                   written.insert(written.end(), these.begin(), these.end());
                                   wire::TableChunk chunk;
                                   chunk.set_table("emb");
                                   chunk.set_dim(4);
                                   chunk.set_optimizer("adagrad");
                                   chunk.set_slots(1);
                                   chunk.set_pushes(pushes);
                                   chunks.emplace_back(chunk, rows);
                                   // New ids evict the rows untouched longest, the ones just
                                   // written among them; pushing those again makes their rows anew,
                                   // in the freed rows the walk has yet to reach.
                                   for (int k = 0; k < 8; ++k) {
                                     EXPECT_TRUE(table->Push(Ids({next_new++}), torch::ones({1, 4})).ok());
                                   }
                                   if (!these.empty()) {
                                     EXPECT_TRUE(table->Push(Ids(these), torch::ones({rows.ids.numel(), 4})).ok());
                                   }
                                   return absl::OkStatus();
                                 })
                  .ok());
  ASSERT_GT(table->evicted_when_full(), 0);
  const std::set<int64_t> distinct(written.begin(), written.end());
  EXPECT_EQ(distinct.size(), written.size()) << "an id was written twice";
  for (int64_t id : written) EXPECT_TRUE(held_at_start.count(id)) << "id " << id << " was made during the walk";
  EXPECT_FALSE(written.empty());
  const auto restored = Make(def);
  int64_t rows_restored = 0;
  for (const auto& [chunk, rows] : chunks) {
    ASSERT_TRUE(restored->CheckRestore(chunk, rows).ok());
    rows_restored += restored->RowsRestoreMakes(rows.ids, nullptr, /*replacing=*/true);
  }
  ASSERT_TRUE(restored->CheckRoomToRestore(rows_restored, /*replacing=*/true).ok());
  for (const auto& [chunk, rows] : chunks) restored->Restore(chunk, rows);
  EXPECT_EQ(restored->size(), static_cast<int64_t>(written.size()));
  // A negative push count (a file no table wrote) is refused.
  wire::TableChunk negative = chunks.front().first;
  negative.set_pushes(-1);
  const absl::Status refused = restored->CheckRestore(negative, chunks.front().second);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_NE(refused.message().find("-1 pushes"), std::string::npos) << refused;
}

TEST(EmbeddingTableTest, RowsStartFromTheSeedWhateverTheShardCount) {
  auto whole = Make(Def("sgd", 10, 4, 0, 1));
  auto shard1 = Make(Def("sgd", 10, 4, 1, 3));
  EXPECT_EQ(shard1->size(), 3);  // ids 1, 4, 7
  const torch::Tensor a = whole->Pull(Ids({1, 4, 7})).value();
  const torch::Tensor b = shard1->Pull(Ids({1, 4, 7})).value();
  EXPECT_TRUE(a.equal(b));
  EXPECT_LE(a.abs().max().item<float>(), 0.5f);
  EXPECT_GT(a.std().item<float>(), 0.05f);  // not all one value
  auto other_seed = Def("sgd");
  other_seed.set_seed(8);
  EXPECT_FALSE(Make(other_seed)->Pull(Ids({1})).value().equal(whole->Pull(Ids({1})).value()));
}

TEST(EmbeddingTableTest, SgdAndAdagradFollowTheirFormulasOnTouchedRowsOnly) {
  for (const std::string kind : {"sgd", "adagrad"}) {
    auto table = Make(Def(kind));
    const torch::Tensor before = table->Pull(Ids({2, 3})).value().clone();
    const torch::Tensor g = torch::full({1, 4}, 2.0f);
    ASSERT_TRUE(table->Push(Ids({2}), g).ok());
    ASSERT_TRUE(table->Push(Ids({2}), g).ok());
    const torch::Tensor after = table->Pull(Ids({2, 3})).value();
    torch::Tensor expected = before[0].clone();
    if (kind == "sgd") {
      expected -= 2 * 0.1 * 2.0;
    } else {  // TensorFlow's: accumulator from 0.1, epsilon 1e-7
      double a = 0.1;
      for (int step = 0; step < 2; ++step) {
        a += 4;
        expected -= 0.1 * 2.0 / (std::sqrt(a) + 1e-7);
      }
    }
    EXPECT_TRUE(torch::allclose(after[0], expected, 1e-5, 1e-6)) << kind << after[0] << expected;
    EXPECT_TRUE(after[1].equal(before[1])) << kind;
  }
}

TEST(EmbeddingTableTest, LazyAdamMovesOnlyTheTouchedRowsMoments) {
  auto table = Make(Def("lazy_adam"));
  const torch::Tensor w0 = table->Pull(Ids({1, 5})).value().clone();
  ASSERT_TRUE(table->Push(Ids({5}), torch::full({1, 4}, 1.0f)).ok());  // push 1: row 5
  ASSERT_TRUE(table->Push(Ids({1}), torch::full({1, 4}, -1.0f)).ok());  // push 2: row 1, first touch
  const torch::Tensor w = table->Pull(Ids({1, 5})).value();
  // Row 5, push 1: m = 0.1, v = 0.001, lr_t = 0.1 * sqrt(1 - 0.999) / (1 - 0.9).
  const double step1 = 0.1 * std::sqrt(1 - 0.999) / (1 - 0.9);
  EXPECT_NEAR(w[1][0].item<float>(), w0[1][0].item<float>() - step1 * 0.1 / (std::sqrt(0.001) + 1e-8), 1e-5);
  // Row 1 was untouched at push 1 (lazy: its moments stayed 0), and its
  // first update is bias-corrected with the table's push count, 2.
  const double step2 = 0.1 * std::sqrt(1 - 0.999 * 0.999) / (1 - 0.9 * 0.9);
  EXPECT_NEAR(w[0][0].item<float>(), w0[0][0].item<float>() + step2 * 0.1 / (std::sqrt(0.001) + 1e-8), 1e-5);
}

TEST(EmbeddingTableTest, FtrlFollowsTensorFlowsApplyFtrl) {
  auto def = Def("ftrl");
  def.mutable_optimizer()->set_l1(0.01);
  def.mutable_optimizer()->set_l2(0.1);
  auto table = Make(def);
  double w = table->Pull(Ids({4})).value()[0][0].item<float>();
  double z = 0, n = 0.1;
  for (double g : {0.5, -0.2, 0.3}) {
    ASSERT_TRUE(table->Push(Ids({4}), torch::full({1, 4}, static_cast<float>(g))).ok());
    const double n_new = n + g * g;
    z += g - (std::sqrt(n_new) - std::sqrt(n)) / 0.1 * w;
    n = n_new;
    w = std::abs(z) > 0.01 ? ((z > 0 ? 0.01 : -0.01) - z) / (std::sqrt(n) / 0.1 + 2 * 0.1) : 0.0;
    EXPECT_NEAR(table->Pull(Ids({4})).value()[0][0].item<float>(), w, 1e-5);
  }
}

TEST(EmbeddingTableTest, BadRequestsAreRefusedNamingTheTableAndIdAndChangeNothing) {
  auto table = Make(Def("adagrad", 10, 4, 1, 2));  // odd ids
  const torch::Tensor before = table->Pull(Ids({1, 3})).value().clone();
  const torch::Tensor g = torch::ones({2, 4});
  struct Case {
    torch::Tensor ids, gradients;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {Ids({1, 11}), g, "id 11 is outside the table's 10 rows"},
      {Ids({1, -3}), g, "id -3 is outside"},
      {Ids({1, 2}), g, "id 2 belongs to shard 0, not 1"},
      {Ids({3, 3}), g, "id 3 appears twice"},
      {Ids({1, 3}), torch::ones({3, 4}), "gradients must be float32 [2, 4]"},
      {Ids({1, 3}), torch::ones({2, 5}), "gradients must be float32 [2, 4]"},
      {Ids({1, 3}), torch::ones({2, 4}, torch::kFloat64), "gradients must be float32"},
      {Ids({1, 3}), torch::tensor({{1.0f, 1.0f, 1.0f, 1.0f}, {1.0f, NAN, 1.0f, 1.0f}}), "the gradient of id 3 is not finite"},
      {torch::tensor({1.0f, 3.0f}), g, "ids must be a 1-D int64 tensor"},
  };
  for (const Case& c : cases) {
    auto pushed = table->Push(c.ids, c.gradients);
    ASSERT_FALSE(pushed.ok()) << c.expected;
    EXPECT_NE(pushed.status().message().find(c.expected), std::string::npos) << pushed.status();
    EXPECT_NE(pushed.status().message().find("table 'emb' on /job:ps/task:0"), std::string::npos) << pushed.status();
  }
  EXPECT_TRUE(table->Pull(Ids({1, 3})).value().equal(before));
  EXPECT_EQ(table->pushes(), 0);
  EXPECT_FALSE(table->Pull(Ids({13})).ok());
  auto kind = Def("adam");
  EXPECT_NE(EmbeddingTable::Create(kind, "t").status().message().find("no sparse form"), std::string::npos);
  auto dim = Def("sgd", 10, 0);
  EXPECT_FALSE(EmbeddingTable::Create(dim, "t").ok());
}

// A fixed table is made whole when created: one that cannot fit in memory
// is refused at once, before anything is allocated (found by
// fuzz/variable_service_fuzz.cc: a request for 2^63 rows kept the ps busy
// mapping chunks). Read-only and dynamic tables grow as rows come, so any
// row count is theirs.
TEST(EmbeddingTableTest, AFixedTableTooLargeForMemoryIsRefusedBeforeAnythingIsAllocated) {
  const absl::Time start = absl::Now();
  auto huge = EmbeddingTable::Create(Def("adagrad", int64_t{1} << 50, 16, 0, 2), "/job:ps/task:0");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  for (const char* says : {"table 'emb' on /job:ps/task:0", "562949953421312 rows x 16 floats", "adagrad's 1 slots",
                           "make it dynamic"}) {
    EXPECT_NE(huge.status().message().find(says), std::string::npos) << says << ": " << huge.status();
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  auto largest = Def("sgd", std::numeric_limits<int64_t>::max(), 65536);
  EXPECT_EQ(EmbeddingTable::Create(largest, "t").status().code(), absl::StatusCode::kResourceExhausted);
  wire::TableDef read_only = Def("adagrad", int64_t{1} << 50, 16);
  read_only.set_read_only(true);
  EXPECT_TRUE(EmbeddingTable::Create(read_only, "t").ok());
  EXPECT_TRUE(EmbeddingTable::Create(Def("adagrad", 0, 16), "t").ok());
}

// Tables that each fit but together do not: the one that would overflow
// is refused naming what the others hold, and nothing of it is made. The
// store is given 8 MB for its tables, as a task with that much memory.
TEST(EmbeddingTableTest, AFixedTableThatFitsOnlyWithoutTheOthersIsRefused) {
  TableStore store("/job:ps/task:0", /*memory_bytes=*/8e6);
  wire::TableDef first = Def("sgd", 1 << 16, 16);  // 4.2 MB
  first.set_name("first");
  ASSERT_TRUE(store.Create({first}).ok());
  wire::TableDef second = first;
  second.set_name("second");
  auto refused = store.Create({second});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("table 'second' on /job:ps/task:0"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find(
                "needs 4.2 MB, which with the 4.2 MB this task holds already is more than the 8.0 MB"),
            std::string::npos)
      << refused.status();
  EXPECT_FALSE(store.Find("second").ok());
  // Two in one request that fit only one at a time: neither is made.
  TableStore empty("/job:ps/task:0", 8e6);
  wire::TableDef third = first;
  third.set_name("third");
  EXPECT_FALSE(empty.Create({first, third}).ok());
  EXPECT_TRUE(empty.All().empty());
  // The task's variables count too (VariableService passes their bytes).
  auto beside_variables = empty.Create({first}, /*other_bytes=*/5e6);
  EXPECT_NE(beside_variables.status().message().find("which with the 5.0 MB this task holds already"),
            std::string::npos)
      << beside_variables.status();
  EXPECT_TRUE(empty.Create({first}, /*other_bytes=*/3e6).ok());
  second.set_rows(1 << 14);  // 1 MB: fits beside the first
  EXPECT_TRUE(store.Create({second}).ok());
}

// A dynamic table's bound is what the task's variables and other tables
// leave of its memory (90% of it), so its rows cannot push them out.
TEST(EmbeddingTableTest, ADynamicTableLeavesTheTasksVariablesTheirRoom) {
  wire::TableDef def = Def("sgd", /*rows=*/0, /*dim=*/64);  // 320 bytes a row with its index entry
  def.set_name("dynamic");
  const torch::Tensor ids = torch::arange(20000, torch::kInt64);
  const torch::Tensor gradient = torch::ones({20000, 64});
  TableStore alone("/job:ps/task:0", /*memory_bytes=*/8e6);
  ASSERT_TRUE(alone.Create({def}).ok());
  ASSERT_TRUE(alone.Find("dynamic").value()->Push(ids, gradient).ok());
  EXPECT_EQ(alone.Find("dynamic").value()->size(), 20000);  // room for 22,500
  TableStore beside_variables("/job:ps/task:0", 8e6);
  ASSERT_TRUE(beside_variables.Create({def}, /*other_bytes=*/5e6).ok());
  EmbeddingTable* table = beside_variables.Find("dynamic").value();
  ASSERT_TRUE(table->Push(ids, gradient).ok());
  EXPECT_EQ(table->size(), 8437);  // 90% of 3 MB, in rows of 320 bytes
  EXPECT_EQ(table->refused_admissions(), 20000 - 8437);
  // max_rows bounds it further, never past what memory holds.
  def.set_max_rows(100);
  TableStore capped("/job:ps/task:0", 8e6);
  ASSERT_TRUE(capped.Create({def}, 5e6).ok());
  ASSERT_TRUE(capped.Find("dynamic").value()->Push(ids, gradient).ok());
  EXPECT_EQ(capped.Find("dynamic").value()->size(), 100);
  // No room at all: refused when made, naming the table and what holds the memory.
  TableStore full("/job:ps/task:0", 8e6);
  auto refused = full.Create({def}, 8e6);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("table 'dynamic' on /job:ps/task:0: a dynamic table needs 320 bytes a "
                                            "row, and the 8.0 MB this task holds already leave no room"),
            std::string::npos)
      << refused.status();
  EXPECT_TRUE(full.All().empty());
}

// Dynamic tables without max_rows share one room (90% of the task's memory
// they find free): the second cannot promise itself what the first holds.
// Rows the first drops give back their index entries, but their storage
// stays the first's (its arenas keep their pages for its next ids).
TEST(EmbeddingTableTest, DynamicTablesShareTheirTasksRoom) {
  wire::TableDef first = Def("sgd", /*rows=*/0, /*dim=*/64);  // 320 bytes a row: 272 of storage, 48 of index
  first.set_name("first");
  first.set_steps_to_live(2);
  wire::TableDef second = first;
  second.set_name("second");
  second.set_steps_to_live(0);
  TableStore store("/job:ps/task:0", /*memory_bytes=*/8e6);  // room for 22,500 rows in all
  ASSERT_TRUE(store.Create({first, second}).ok());
  EmbeddingTable* a = store.Find("first").value();
  EmbeddingTable* b = store.Find("second").value();
  const torch::Tensor ids = torch::arange(20000, torch::kInt64);
  const torch::Tensor gradient = torch::ones({20000, 64});
  ASSERT_TRUE(a->Push(ids, gradient).ok());
  EXPECT_EQ(a->size(), 20000);
  ASSERT_TRUE(b->Push(ids, gradient).ok());
  EXPECT_EQ(b->size(), 2500);  // what the first left
  EXPECT_EQ(b->refused_admissions(), 17500);
  // The first's rows expire (steps_to_live 2): their index entries come
  // back (20,000 x 48 bytes), their storage stays the first's.
  const torch::Tensor none = torch::empty({0}, torch::kInt64);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(a->Push(none, torch::empty({0, 64})).ok());
  EXPECT_EQ(a->size(), 0);
  ASSERT_TRUE(b->Push(ids.narrow(0, 0, 3500), gradient.narrow(0, 0, 3500)).ok());
  EXPECT_EQ(b->size(), 3500);  // 1,000 rows more, 320 bytes each
  // New ids of the first reuse its storage and take index entries alone:
  // the 640,000 bytes left hold 13,333.
  ASSERT_TRUE(a->Push(ids + 20000, gradient).ok());
  EXPECT_EQ(a->size(), 13333);
  EXPECT_EQ(store.shared_room().held(), a->shared_bytes() + b->shared_bytes());
  // Nor does a restore go past the shared room: nothing changes. (Its
  // 10,000 rows replace the second table's 3,500, whose storage they reuse:
  // 6,500 rows of 320 bytes more.)
  const std::string path = ::testing::TempDir() + "/shared_room.tables";
  TableStore saved("/job:ps/task:0", 8e6);
  ASSERT_TRUE(saved.Create({second}).ok());
  ASSERT_TRUE(
      saved.Find("second").value()->Push(ids.narrow(0, 0, 10000) + 100000, gradient.narrow(0, 0, 10000)).ok());
  ASSERT_TRUE(SaveTables(saved, path).value());
  absl::StatusOr<int64_t> refused = RestoreTables(store, {path});
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("the dynamic tables on /job:ps/task:0: the checkpoint's rows need 2.1 MB "
                                            "more, which with the 7.2 MB their rows hold already is more than the 7.2 MB"),
            std::string::npos)
      << refused.status();
  EXPECT_EQ(b->size(), 3500);
  TableStore empty("/job:ps/task:0", 8e6);
  ASSERT_TRUE(empty.Create({first, second}).ok());
  EXPECT_EQ(RestoreTables(empty, {path}).value(), 10000);
  EXPECT_EQ(empty.shared_room().held(), 10000 * 320);
}

// Variables made after a dynamic table leave it less room: it holds what
// 90% of the rest takes, as if they had come first.
TEST(EmbeddingTableTest, VariablesMadeAfterADynamicTableShrinkItsRoom) {
  wire::TableDef def = Def("sgd", /*rows=*/0, /*dim=*/64);  // 320 bytes a row
  def.set_name("dynamic");
  TableStore store("/job:ps/task:0", /*memory_bytes=*/8e6);
  ASSERT_TRUE(store.Create({def}).ok());
  store.VariablesHold(5e6);
  EmbeddingTable* table = store.Find("dynamic").value();
  ASSERT_TRUE(table->Push(torch::arange(20000, torch::kInt64), torch::ones({20000, 64})).ok());
  EXPECT_EQ(table->size(), 8437);  // 90% of 3 MB, in rows of 320 bytes
  store.VariablesHold(8e6);        // rows held stay; no new one comes
  ASSERT_TRUE(table->Push(torch::arange(20000, 20100, torch::kInt64), torch::ones({100, 64})).ok());
  EXPECT_EQ(table->size(), 8437);
}

// Variables that would not fit in the task's memory beside what it holds
// (values, optimizer slots, tables) are refused before anything is
// allocated, naming the figures; what fits is made.
TEST(EmbeddingTableTest, VariablesThatDoNotFitBesideTheTablesAreRefused) {
  VariableServiceOptions options{"/job:ps/task:0"};
  options.memory_bytes = 8e6;
  VariableService service(options);
  auto create = [&](const std::string& name, int64_t floats, const std::string& optimizer) {
    Request request;
    wire::VariableDef* def = request.header.mutable_create_variables()->add_variables();
    def->set_name(name);
    def->add_shape(floats);
    def->mutable_optimizer()->set_kind(optimizer);
    request.tensors.push_back(torch::zeros({floats}));
    Response response;
    service.Handle(request, &response);
    return response;
  };
  wire::TableDef table = Def("sgd", /*rows=*/16384, /*dim=*/64);  // 4.2 MB, one arena chunk
  table.set_name("fixed");
  ASSERT_TRUE(service.tables().Create({table}).ok());
  // Adam keeps two slots: 400,000 floats take 4.8 MB, more than the 3.8 MB left.
  Response refused = create("big", 400000, "adam");
  EXPECT_EQ(refused.header.status_code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(refused.header.status_message().find("variables on /job:ps/task:0: the new ones need 4.8 MB (values and "
                                                 "optimizer slots), which with the 0 bytes of variables and 4.2 MB of "
                                                 "tables this task holds already is more than the 8.0 MB"),
            std::string::npos)
      << refused.header.status_message();
  EXPECT_EQ(service.store().bytes(), 0);
  // Plain SGD keeps none: the same values fit.
  Response made = create("big", 400000, "sgd");
  EXPECT_EQ(made.header.status_code(), 0) << made.header.status_message();
  EXPECT_EQ(service.store().bytes(), 1600000);
}

// The shared room's count follows what a table holds, whichever way a row
// or sighting comes and goes: admitted from a sighting, evicted when full,
// expired, its storage reused.
TEST(EmbeddingTableTest, TheSharedRoomCountsWhatATableHolds) {
  wire::TableDef def = Def("adagrad", /*rows=*/0, /*dim=*/8);
  def.set_name("churn");
  def.set_min_count(2);
  def.set_steps_to_live(6);
  def.set_max_rows(300);
  def.set_evict_when_full(true);
  TableStore store("/job:ps/task:0", 1e9);
  ASSERT_TRUE(store.Create({def}).ok());
  EmbeddingTable* table = store.Find("churn").value();
  torch::manual_seed(3);
  for (int step = 0; step < 200; ++step) {
    const torch::Tensor ids = std::get<0>(torch::_unique(torch::randint(0, 2000, {150}, torch::kInt64)));
    ASSERT_TRUE(table->Push(ids, torch::ones({ids.size(0), 8})).ok());
    ASSERT_EQ(store.shared_room().held(), table->shared_bytes()) << "after push " << step;
  }
  EXPECT_GT(table->evicted_when_full(), 0);
  const int64_t storage_and_rows = store.shared_room().held();
  const torch::Tensor none = torch::empty({0}, torch::kInt64);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(table->Push(none, torch::empty({0, 8})).ok());
  EXPECT_EQ(table->size(), 0);
  EXPECT_EQ(store.shared_room().held(), table->shared_bytes());
  EXPECT_LT(store.shared_room().held(), storage_and_rows);  // index entries came back; the storage stays
}

TEST(EmbeddingTableTest, ADynamicTableAdmitsRowsAfterMinCountAndEvictsIdleOnes) {
  auto def = Def("sgd", /*rows=*/0);
  def.set_min_count(2);
  def.set_steps_to_live(4);
  auto table = Make(def);
  const int64_t big = int64_t{1} << 40;
  const torch::Tensor initial = table->Pull(Ids({big, -5})).value().clone();
  EXPECT_EQ(table->size(), 0);  // pulls make nothing
  const torch::Tensor g = torch::ones({1, 4});
  ASSERT_TRUE(table->Push(Ids({big}), g).ok());  // seen once: not admitted, gradient dropped
  EXPECT_EQ(table->size(), 0);
  EXPECT_TRUE(table->Pull(Ids({big})).value().equal(initial.narrow(0, 0, 1)));
  ASSERT_TRUE(table->Push(Ids({big}), g).ok());  // twice: admitted, applied
  EXPECT_EQ(table->size(), 1);
  EXPECT_TRUE(torch::allclose(table->Pull(Ids({big})).value(), initial.narrow(0, 0, 1) - 0.1));
  // -5 kept busy (admitted on its second push), `big` left alone: gone
  // within 1.25 x steps_to_live pushes.
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(table->Push(Ids({-5}), g).ok());
  EXPECT_EQ(table->size(), 1);
  EXPECT_TRUE(table->Pull(Ids({big})).value().equal(initial.narrow(0, 0, 1)));  // back to its initial value
  EXPECT_TRUE(torch::allclose(table->Pull(Ids({-5})).value(), initial.narrow(0, 1, 1) - 0.7));
}

// A dynamic table's shard holds at most its share of max_rows: new ids
// beyond it are refused (gradients dropped, pulls answered with initial
// rows) until eviction makes room, and sightings below min_count count
// against the same room, so an unbounded id stream cannot grow the ps.
TEST(EmbeddingTableTest, AFullDynamicTableAdmitsNoNewIdUntilEvictionMakesRoom) {
  auto def = Def("sgd", /*rows=*/0, /*dim=*/2);
  def.set_max_rows(3);
  def.set_steps_to_live(4);
  auto table = Make(def);
  const torch::Tensor initial = table->Pull(Ids({3, 4})).value().clone();
  ASSERT_TRUE(table->Push(Ids({0, 1, 2}), torch::ones({3, 2})).ok());
  ASSERT_TRUE(table->Push(Ids({3, 4}), torch::ones({2, 2})).ok());
  EXPECT_EQ(table->size(), 3);
  EXPECT_EQ(table->refused_admissions(), 2);
  EXPECT_TRUE(table->Pull(Ids({3, 4})).value().equal(initial));  // their gradients were dropped
  // Only 0 stays busy: 1 and 2 are evicted, and 3 then gets a row.
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(table->Push(Ids({0}), torch::ones({1, 2})).ok());
  EXPECT_EQ(table->size(), 1);
  ASSERT_TRUE(table->Push(Ids({3}), torch::ones({1, 2})).ok());
  EXPECT_EQ(table->size(), 2);
  EXPECT_TRUE(torch::allclose(table->Pull(Ids({3})).value(), initial.narrow(0, 0, 1) - 0.1));

  // Sightings take room too: with min_count 2 and room for 2, a third new
  // id is not even remembered; a remembered one is admitted on its second push.
  auto counted = Def("sgd", 0, 2);
  counted.set_max_rows(2);
  counted.set_min_count(2);
  auto sighted = Make(counted);
  for (int64_t id : {10, 11, 12}) ASSERT_TRUE(sighted->Push(Ids({id}), torch::ones({1, 2})).ok());
  EXPECT_EQ(sighted->refused_admissions(), 1);
  ASSERT_TRUE(sighted->Push(Ids({10, 12}), torch::ones({2, 2})).ok());
  EXPECT_EQ(sighted->size(), 1);  // 10 admitted; 12 was never remembered
  EXPECT_EQ(sighted->refused_admissions(), 2);

  // Each of 2 shards holds its share, rounded up; a fixed table takes none.
  auto sharded = Def("sgd", 0, 2, /*shard=*/0, /*shards=*/2);
  sharded.set_max_rows(3);
  auto half = Make(sharded);
  ASSERT_TRUE(half->Push(Ids({0, 2, 4, 6}), torch::ones({4, 2})).ok());
  EXPECT_EQ(half->size(), 2);
  auto fixed = Def("sgd", 10, 2);
  fixed.set_max_rows(5);
  EXPECT_NE(EmbeddingTable::Create(fixed, "t").status().message().find("are for dynamic tables (rows: 0)"),
            std::string::npos);
  auto negative = Def("sgd", 0, 2);
  negative.set_max_rows(-1);
  EXPECT_FALSE(EmbeddingTable::Create(negative, "t").ok());
}

// With evict_when_full a full shard makes room for a new id by dropping
// what no push has touched for longest (rows and sightings alike), never
// what the current push touched: a push of more new ids than the shard
// holds admits what fits and refuses the rest.
TEST(EmbeddingTableTest, AFullTableThatEvictsDropsTheRowsUntouchedLongest) {
  auto def = Def("sgd", /*rows=*/0, /*dim=*/2);
  def.set_max_rows(4);
  def.set_evict_when_full(true);
  auto table = Make(def);
  auto initial = [&](int64_t id) {
    torch::Tensor row = torch::empty({1, 2});
    EmbeddingTable::InitialRow(table->def(), id, row.data_ptr<float>());
    return row;
  };
  auto held = [&](int64_t id) { return !table->Pull(Ids({id})).value().equal(initial(id)); };
  for (auto ids : std::vector<std::vector<int64_t>>{{0, 1}, {2}, {3}, {0}}) {
    ASSERT_TRUE(table->Push(Ids(ids), torch::ones({static_cast<int64_t>(ids.size()), 2})).ok());
  }
  ASSERT_TRUE(table->Push(Ids({4}), torch::ones({1, 2})).ok());  // 1 is the oldest: 0 was pushed again
  EXPECT_EQ(table->size(), 4);
  EXPECT_FALSE(held(1));
  for (int64_t id : {0, 2, 3, 4}) EXPECT_TRUE(held(id)) << id;
  EXPECT_TRUE(torch::allclose(table->Pull(Ids({4})).value(), initial(4) - 0.1));
  ASSERT_TRUE(table->Push(Ids({5, 6}), torch::ones({2, 2})).ok());  // then 2 and 3
  EXPECT_FALSE(held(2));
  EXPECT_FALSE(held(3));
  EXPECT_EQ(table->evicted_when_full(), 3);
  EXPECT_EQ(table->refused_admissions(), 0);
  // Five new ids in one push: four take the older rows, the fifth finds
  // only rows this push touched, and is refused.
  ASSERT_TRUE(table->Push(Ids({7, 8, 9, 10, 11}), torch::ones({5, 2})).ok());
  EXPECT_EQ(table->size(), 4);
  for (int64_t id : {7, 8, 9, 10}) EXPECT_TRUE(held(id)) << id;
  EXPECT_FALSE(held(11));
  EXPECT_EQ(table->refused_admissions(), 1);

  // Sightings below min_count make room the same way.
  auto counted = Def("sgd", 0, 2);
  counted.set_max_rows(2);
  counted.set_min_count(2);
  counted.set_evict_when_full(true);
  auto sighted = Make(counted);
  for (int64_t id : {20, 21, 22}) ASSERT_TRUE(sighted->Push(Ids({id}), torch::ones({1, 2})).ok());
  ASSERT_TRUE(sighted->Push(Ids({20, 22}), torch::ones({2, 2})).ok());
  // 22 has a row on its second sighting; 20 was forgotten to make room for
  // 22, so its second push was a first sighting again (and 21 went for it).
  EXPECT_EQ(sighted->size(), 1);
  EXPECT_EQ(sighted->refused_admissions(), 0);

  auto fixed = Def("sgd", 10, 2);
  fixed.set_evict_when_full(true);
  EXPECT_NE(EmbeddingTable::Create(fixed, "t").status().message().find("evict_when_full and eviction are for dynamic tables"),
            std::string::npos);
}

// eviction: lfu keeps the rows pushes touched most often, where lru keeps
// the rows touched last: id 1, pushed three times but not lately, stays
// under lfu and goes under lru.
TEST(EmbeddingTableTest, EvictionByCountKeepsTheRowsTouchedMostOften) {
  for (const std::string eviction : {"lru", "lfu"}) {
    auto def = Def("sgd", /*rows=*/0, /*dim=*/2);
    def.set_max_rows(4);
    def.set_evict_when_full(true);
    def.set_eviction(eviction);
    auto table = Make(def);
    auto held = [&](int64_t id) {
      torch::Tensor initial = torch::empty({1, 2});
      EmbeddingTable::InitialRow(table->def(), id, initial.data_ptr<float>());
      return !table->Pull(Ids({id})).value().equal(initial);
    };
    for (int64_t id : {1, 1, 1, 2, 3, 4, 5}) ASSERT_TRUE(table->Push(Ids({id}), torch::ones({1, 2})).ok());
    EXPECT_EQ(table->size(), 4) << eviction;
    EXPECT_EQ(held(1), eviction == "lfu") << eviction;
    EXPECT_EQ(held(2), eviction == "lru") << eviction;  // lfu: the first of the rows touched once
    for (int64_t id : {3, 4, 5}) EXPECT_TRUE(held(id)) << eviction << " " << id;
  }
  auto wrong = Def("sgd", /*rows=*/0);
  wrong.set_evict_when_full(true);
  wrong.set_eviction("lifo");
  EXPECT_NE(EmbeddingTable::Create(wrong, "t").status().message().find("eviction 'lifo' is not lru or lfu"),
            std::string::npos);
  wrong.set_eviction("lfu");
  wrong.set_evict_when_full(false);
  EXPECT_NE(EmbeddingTable::Create(wrong, "t").status().message().find("set evict_when_full"), std::string::npos);
}

// A large shard drops 1/64 of its room per sweep, the oldest found by
// counting ages in buckets of several pushes: exactly that many go, all of
// them older than everything that stays, except within the boundary bucket.
TEST(EmbeddingTableTest, EvictionDropsTheOldestSixtyFourthOfTheRoomAtOnce) {
  auto def = Def("sgd", 0, 2);
  def.set_max_rows(640);
  def.set_evict_when_full(true);
  auto table = Make(def);
  for (int64_t id = 0; id < 640; ++id) ASSERT_TRUE(table->Push(Ids({id}), torch::ones({1, 2})).ok());
  // Id 0 stays busy while 2000 pushes go by: the other ages then span more
  // pushes than there are buckets (3 pushes a bucket).
  for (int i = 0; i < 2000; ++i) ASSERT_TRUE(table->Push(Ids({0}), torch::ones({1, 2})).ok());
  const torch::Tensor before = table->Pull(torch::arange(0, 640, torch::kInt64)).value().clone();
  ASSERT_TRUE(table->Push(Ids({5000}), torch::ones({1, 2})).ok());
  EXPECT_EQ(table->evicted_when_full(), 10);
  EXPECT_EQ(table->size(), 631);
  const torch::Tensor after = table->Pull(torch::arange(0, 640, torch::kInt64)).value();
  std::vector<int64_t> gone;
  for (int64_t id = 0; id < 640; ++id) {
    if (!after[id].equal(before[id])) gone.push_back(id);
  }
  ASSERT_EQ(gone.size(), 10u);
  // Id k was last pushed by push k + 1: buckets of 3 from push 2 hold ids
  // 1-3, 4-6, 7-9 (all gone) and 10-12, of which one goes.
  for (int64_t id = 1; id <= 9; ++id) EXPECT_EQ(gone[id - 1], id);
  EXPECT_TRUE(gone[9] >= 10 && gone[9] <= 12) << gone[9];
}

// A stream of new ids into a full shard evicts about one row per new id
// (a sweep's 1/64 at a time), not more: the shard stays about full.
TEST(EmbeddingTableTest, EvictionFreesOnlyTheRoomNewIdsTake) {
  auto def = Def("sgd", 0, 2);
  def.set_max_rows(6400);
  def.set_evict_when_full(true);
  auto table = Make(def);
  int64_t next = 0;
  for (int push = 0; push < 20; ++push) {
    ASSERT_TRUE(table->Push(torch::arange(next, next + 1000, torch::kInt64), torch::ones({1000, 2})).ok());
    next += 1000;
    const int64_t beyond = std::max<int64_t>(0, next - 6400);  // new ids past the room
    EXPECT_GE(table->evicted_when_full(), beyond) << push;
    EXPECT_LE(table->evicted_when_full(), beyond + 100) << push;  // one sweep's worth ahead at most
    EXPECT_GE(table->size(), std::min<int64_t>(next, 6400) - 100) << push;
  }
  EXPECT_EQ(table->refused_admissions(), 0);
}

TEST(EmbeddingTableTest, TheClientPullsAndPushesByIdOverTwoPsTasks) {
  JobConfig config;
  config.cluster.ps = 2;
  const ClusterSpec cluster = ClusterSpec::Local(2, 1);
  InProcServers servers(config, cluster);
  auto client = Client::Create(cluster, &servers.transport, MakePlacement(config, cluster).value()).value();
  auto def = Def("sgd", 100, 3);
  ASSERT_TRUE(client->CreateTables({def}).ok());
  ASSERT_TRUE(client->CreateTables({def}).ok());  // the same again: left alone
  auto changed = def;
  changed.set_dim(4);
  auto refused = client->CreateTables({changed});
  EXPECT_TRUE(absl::IsAlreadyExists(refused)) << refused;
  EXPECT_NE(refused.message().find("dim 3 vs 4"), std::string::npos) << refused;
  // Another admission or eviction rule is another table too, not one kept
  // silently by its first rule; the defaults compare as applied.
  auto dynamic = Def("sgd", 0, 3);
  dynamic.set_name("dynamic");
  dynamic.set_max_rows(1000);
  dynamic.set_evict_when_full(true);
  ASSERT_TRUE(client->CreateTables({dynamic}).ok());
  auto same = dynamic;
  same.set_eviction("lru");
  same.set_min_count(1);
  EXPECT_TRUE(client->CreateTables({same}).ok()) << "lru and min_count 1 are the defaults";
  auto lfu = dynamic;
  lfu.set_eviction("lfu");
  auto bigger = dynamic;
  bigger.set_max_rows(2000);
  auto admitting = dynamic;
  admitting.set_min_count(3);
  for (const auto& [other, named] : std::vector<std::pair<wire::TableDef, std::string>>{
           {lfu, "eviction lru vs lfu"}, {bigger, "max_rows 1000 vs 2000"}, {admitting, "min_count 0 vs 3"}}) {
    const absl::Status again = client->CreateTables({other});
    EXPECT_TRUE(absl::IsAlreadyExists(again)) << again;
    EXPECT_NE(again.message().find("table 'dynamic' exists on /job:ps/task:"), std::string::npos) << again;
    EXPECT_NE(again.message().find(named), std::string::npos) << again;
  }

  auto reference = Make(Def("sgd", 100, 3));
  const torch::Tensor ids = Ids({5, 8, 5, 99, 0});
  const torch::Tensor rows = client->PullRows("emb", ids).value();
  EXPECT_TRUE(rows.equal(reference->Pull(ids).value()));
  // Repeated ids' gradients are summed on the worker, one row per id.
  const torch::Tensor g = torch::arange(15, torch::kFloat32).reshape({5, 3});
  ASSERT_TRUE(client->PushRows("emb", ids, g).ok());
  const torch::Tensor after = client->PullRows("emb", Ids({5, 8})).value();
  EXPECT_TRUE(torch::allclose(after[0], rows[0] - 0.1 * (g[0] + g[2])));
  EXPECT_TRUE(torch::allclose(after[1], rows[1] - 0.1 * g[1]));
  // Only the distinct ids travel, each to its own shard.
  EXPECT_EQ(servers.services[0]->tables().Find("emb").value()->pushes(), 1);  // ids 8, 0 (even)
  EXPECT_EQ(servers.services[1]->tables().Find("emb").value()->pushes(), 1);  // 5, 99

  auto out_of_range = client->PullRows("emb", Ids({3, 100}));
  EXPECT_TRUE(absl::IsOutOfRange(out_of_range.status())) << out_of_range.status();
  EXPECT_NE(out_of_range.status().message().find("table 'emb' on /job:ps/task:0: id 100 is outside"),
            std::string::npos)
      << out_of_range.status();
  auto mismatch = client->PushRows("emb", Ids({1, 2}), torch::ones({3, 3}));
  EXPECT_NE(mismatch.message().find("one row per id (2 ids)"), std::string::npos) << mismatch;
  auto unknown = client->PullRows("nope", Ids({1}));
  EXPECT_TRUE(absl::IsNotFound(unknown.status())) << unknown.status();
  // No ids (an empty batch): no rows, of the table's width; the table must exist.
  const torch::Tensor none = client->PullRows("emb", Ids({})).value();
  EXPECT_EQ(none.sizes(), (std::vector<int64_t>{0, 3}));
  EXPECT_TRUE(absl::IsNotFound(client->PullRows("nope", Ids({})).status()));

  // How full a table is, over its shards: a fixed one holds all its rows; a
  // dynamic one what was admitted, and says what it turned away or evicted.
  EXPECT_EQ(client->Occupancy("emb").value().rows_held, 100);
  auto capped = Def("sgd", 0, 3);
  capped.set_name("capped");
  capped.set_max_rows(4);  // 2 rows a shard
  auto evicting = capped;
  evicting.set_name("evicting");
  evicting.set_evict_when_full(true);
  ASSERT_TRUE(client->CreateTables({capped, evicting}).ok());
  for (const char* table : {"capped", "evicting"}) {
    ASSERT_TRUE(client->PushRows(table, Ids({0, 1, 2, 3}), torch::ones({4, 3})).ok());
    ASSERT_TRUE(client->PushRows(table, Ids({4, 5, 6}), torch::ones({3, 3})).ok());
  }
  const Client::TableOccupancy refusing = client->Occupancy("capped").value();
  EXPECT_EQ(refusing.rows_held, 4);
  EXPECT_EQ(refusing.ids_refused, 3);
  EXPECT_EQ(refusing.rows_evicted, 0);
  const Client::TableOccupancy evicted = client->Occupancy("evicting").value();
  EXPECT_EQ(evicted.rows_held, 4);  // 4 and 6 on shard 0 (0 and 2 made room), 3 and 5 on shard 1
  EXPECT_EQ(evicted.ids_refused, 0);
  EXPECT_EQ(evicted.rows_evicted, 3);
  EXPECT_TRUE(absl::IsNotFound(client->Occupancy("nope").status()));
}

// A pull's answer is bounded before it is made: ids x dim floats over the
// message limit are refused, and the server goes on serving.
TEST(EmbeddingTableTest, APullWhoseAnswerWouldExceedTheMessageLimitIsRefusedFirst) {
  VariableService service(VariableServiceOptions{"/job:ps/task:0", /*max_message_bytes=*/4096});
  ASSERT_TRUE(service.tables().Create({Def("sgd", 1000, 64)}).ok());
  Request request;
  request.header.mutable_pull_rows()->set_table("emb");
  request.tensors.push_back(torch::arange(16, torch::kInt64));  // 16 x 64 x 4 = 4096 bytes: fits
  Response response;
  service.Handle(request, &response);
  EXPECT_EQ(response.header.status_code(), 0) << response.header.status_message();
  request.tensors[0] = torch::arange(17, torch::kInt64);
  service.Handle(request, &response);
  EXPECT_EQ(response.header.status_code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(response.header.status_message().find("would answer 4352 bytes, over the limit of 4096"),
            std::string::npos)
      << response.header.status_message();
}

}  // namespace
}  // namespace shoal
