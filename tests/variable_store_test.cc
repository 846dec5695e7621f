#include "shoal/server/variable_store.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <map>
#include <set>
#include <thread>

namespace shoal {
namespace {

wire::VariableDef Def(const std::string& name, std::vector<int64_t> shape, const std::string& kind = "sgd",
                      double lr = 0.5, bool use_locking = false) {
  wire::VariableDef def;
  def.set_name(name);
  for (int64_t d : shape) def.add_shape(d);
  def.mutable_optimizer()->set_kind(kind);
  def.mutable_optimizer()->set_learning_rate(lr);
  def.set_use_locking(use_locking);
  return def;
}

class VariableStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(store_.Create({Def("w", {2, 3}), Def("b", {3})}, {torch::ones({2, 3}), torch::zeros({3})}).ok());
  }
  torch::Tensor Value(const std::string& name) {
    std::vector<torch::Tensor> values;
    std::vector<int64_t> versions;
    EXPECT_TRUE(store_.Read({name}, &values, &versions).ok());
    return values[0].clone();
  }
  VariableStore store_{"/job:ps/task:0"};
};

TEST(AllFiniteTest, FindsEveryNonFiniteValueWhereverItSits) {
  const int64_t n = 1003;  // not a multiple of any vector width: the tail counts too
  EXPECT_TRUE(AllFinite(torch::zeros({n})));
  EXPECT_TRUE(AllFinite(torch::empty({0})));
  const float finite_edges[] = {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                                std::numeric_limits<float>::denorm_min(), -0.0f};
  for (float edge : finite_edges) {
    torch::Tensor t = torch::ones({n});
    t[n - 1] = edge;
    EXPECT_TRUE(AllFinite(t)) << edge;
  }
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  for (float value : bad) {
    for (int64_t at : {int64_t{0}, int64_t{7}, n / 2, n - 1}) {
      torch::Tensor t = torch::ones({n});
      t[at] = value;
      EXPECT_FALSE(AllFinite(t)) << value << " at " << at;
    }
  }
  EXPECT_FALSE(AllFinite(torch::ones({4, 8}).t().index_fill(0, torch::tensor({3}), NAN)));  // non-contiguous
}

TEST_F(VariableStoreTest, AppliesGradientsWithTheOptimizer) {
  std::vector<int64_t> versions;
  ASSERT_TRUE(store_.ApplyGradients({"w", "b"}, {torch::ones({2, 3}), torch::full({3}, 2.0f)}, &versions).ok());
  EXPECT_EQ(versions, (std::vector<int64_t>{1, 1}));
  EXPECT_TRUE(Value("w").allclose(torch::full({2, 3}, 0.5f)));
  EXPECT_TRUE(Value("b").allclose(torch::full({3}, -1.0f)));
}

// Found by fuzz/variable_service_fuzz.cc: momentum set on a variable made
// without it had no buffer (the next apply indexed past its slots), and
// RMSProp without momentum kept undefined slots, which read_slots,
// assign_slots and checkpoints could not copy (the ps died of the
// exception).
TEST_F(VariableStoreTest, MomentumTurnedOnLaterGetsItsBufferAndEverySlotCanBeReadAndSaved) {
  wire::OptimizerConfig momentum;
  momentum.set_kind("sgd");
  momentum.set_learning_rate(0.5);
  momentum.set_momentum(0.9);
  const int64_t bytes_before = store_.bytes();
  ASSERT_TRUE(store_.SetOptimizer({"w"}, momentum).ok());
  EXPECT_EQ(store_.bytes(), bytes_before + 6 * 4);  // the momentum buffer, counted for the tables' memory check
  std::vector<int64_t> versions;
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(store_.ApplyGradients({"w"}, {torch::ones({2, 3})}, &versions).ok());
  // buf = 1, then 0.9 + 1: w = 1 - 0.5 - 0.95.
  EXPECT_TRUE(Value("w").allclose(torch::full({2, 3}, 1.0f - 0.5f - 0.95f)));

  ASSERT_TRUE(store_.Create({Def("r", {4}, "rmsprop", 0.01)}, {torch::ones({4})}).ok());
  ASSERT_TRUE(store_.ApplyGradients({"r"}, {torch::ones({4})}, &versions).ok());
  std::vector<OptimizerSlots> slots;
  ASSERT_TRUE(store_.ReadSlots({"r", "w"}, &slots).ok());
  ASSERT_EQ(slots[0].tensors.size(), 3u);
  for (const torch::Tensor& t : slots[0].tensors) EXPECT_TRUE(t.defined() && t.sizes() == torch::IntArrayRef({4}));
  EXPECT_TRUE(store_.AssignSlots({"r"}, {slots[0]}).ok());
  for (const SavedVariable& saved : store_.Snapshot()) {
    for (const torch::Tensor& t : saved.slots.tensors) EXPECT_TRUE(t.defined()) << saved.name;
  }
  wire::OptimizerConfig centered;
  centered.set_kind("rmsprop");
  centered.set_learning_rate(0.01);
  centered.set_momentum(0.5);
  centered.set_centered(true);
  ASSERT_TRUE(store_.SetOptimizer({"r"}, centered).ok());
  ASSERT_TRUE(store_.ApplyGradients({"r"}, {torch::ones({4})}, &versions).ok());
  EXPECT_TRUE(AllFinite(Value("r")));
}

TEST_F(VariableStoreTest, UnknownVariableNamesVariableAndTaskAndChangesNothing) {
  std::vector<int64_t> versions;
  absl::Status status = store_.ApplyGradients({"w", "nope"}, {torch::ones({2, 3}), torch::ones({1})}, &versions);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(status.message().find("'nope'"), std::string::npos);
  EXPECT_NE(status.message().find("/job:ps/task:0"), std::string::npos);
  EXPECT_TRUE(Value("w").equal(torch::ones({2, 3})));
}

TEST_F(VariableStoreTest, ShapeMismatchIsRefusedBeforeAnythingIsApplied) {
  std::vector<int64_t> versions;
  absl::Status status = store_.ApplyGradients({"w", "b"}, {torch::ones({2, 3}), torch::ones({4})}, &versions);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("shape [4] does not match the variable's [3]"), std::string::npos) << status;
  EXPECT_TRUE(Value("w").equal(torch::ones({2, 3})));  // the first, valid gradient was not applied either
}

TEST_F(VariableStoreTest, DtypeMismatchIsRefused) {
  std::vector<int64_t> versions;
  absl::Status status = store_.Assign({"b"}, {torch::ones({3}, torch::kFloat64)}, &versions);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("float32"), std::string::npos);
}

TEST_F(VariableStoreTest, NanGradientIsRefusedAndChangesNothing) {
  std::vector<int64_t> versions;
  torch::Tensor grad = torch::ones({2, 3});
  grad[1][2] = std::numeric_limits<float>::quiet_NaN();
  absl::Status status = store_.ApplyGradients({"b", "w"}, {torch::ones({3}), grad}, &versions);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("NaN"), std::string::npos);
  EXPECT_NE(status.message().find("'w'"), std::string::npos);
  EXPECT_TRUE(Value("b").equal(torch::zeros({3})));
  grad[1][2] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(store_.ApplyGradients({"w"}, {grad}, &versions).ok());
}

TEST_F(VariableStoreTest, RecreatingWithSameDefinitionKeepsTheValue) {
  std::vector<int64_t> versions;
  ASSERT_TRUE(store_.Assign({"b"}, {torch::full({3}, 7.0f)}, &versions).ok());
  auto created = store_.Create({Def("b", {3}), Def("c", {1})}, {torch::zeros({3}), torch::zeros({1})});
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(*created, (std::vector<bool>{false, true}));
  EXPECT_TRUE(Value("b").equal(torch::full({3}, 7.0f)));
}

TEST_F(VariableStoreTest, RecreatingWithDifferentDefinitionIsAlreadyExistsAndCreatesNothing) {
  auto created = store_.Create({Def("d", {1}), Def("b", {4})}, {torch::zeros({1}), torch::zeros({4})});
  EXPECT_EQ(created.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(store_.Lookup({"d"})[0].present == false);
}

TEST_F(VariableStoreTest, CreateValidatesInitialValues) {
  EXPECT_FALSE(store_.Create({Def("e", {2})}, {torch::zeros({3})}).ok());
  EXPECT_FALSE(store_.Create({Def("e", {2}, "nosuch")}, {torch::zeros({2})}).ok());
  EXPECT_FALSE(store_.Create({Def("", {2})}, {torch::zeros({2})}).ok());
  EXPECT_FALSE(store_.Create({Def("e", {1}), Def("e", {1})}, {torch::zeros({1}), torch::zeros({1})}).ok());
}

wire::VariableDef BufferDef(const std::string& name, std::vector<int64_t> shape, wire::DType dtype) {
  wire::VariableDef def = Def(name, std::move(shape));
  def.set_buffer(true);
  def.set_dtype(dtype);
  return def;
}

TEST_F(VariableStoreTest, BuffersAreReadAssignedAndAddedToAtTheirDtypeButNeverTrained) {
  ASSERT_TRUE(store_
                  .Create({BufferDef("bn/running_mean", {3}, wire::DTYPE_FLOAT32),
                           BufferDef("bn/num_batches_tracked", {}, wire::DTYPE_INT64)},
                          {torch::zeros({3}), torch::tensor(int64_t{5})})
                  .ok());
  std::vector<int64_t> versions;
  const int64_t big = (int64_t{1} << 40) + 1;  // beyond what float32 holds exactly
  ASSERT_TRUE(store_.Assign({"bn/num_batches_tracked"}, {torch::tensor(big)}, &versions).ok());
  ASSERT_TRUE(store_.ApplyGradients({"bn/num_batches_tracked"}, {torch::tensor(int64_t{2})}, &versions,
                                    wire::UPDATE_ADD)
                  .ok());
  EXPECT_EQ(Value("bn/num_batches_tracked").scalar_type(), torch::kInt64);
  EXPECT_EQ(Value("bn/num_batches_tracked").item<int64_t>(), big + 2);
  // Training a buffer, or giving it the wrong dtype, is refused and changes nothing.
  for (const std::string& name : {std::string("bn/running_mean"), std::string("bn/num_batches_tracked")}) {
    const torch::Tensor like = Value(name);
    absl::Status status = store_.ApplyGradients({name}, {torch::ones_like(like)}, &versions);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_NE(status.message().find("'" + name + "' on /job:ps/task:0: it is a buffer"), std::string::npos) << status;
    std::vector<bool> accepted;
    EXPECT_EQ(store_.Accumulate({name}, {torch::ones_like(like)}, 0, "w0", &accepted).code(),
              absl::StatusCode::kFailedPrecondition);
  }
  absl::Status wrong = store_.Assign({"bn/num_batches_tracked"}, {torch::tensor(3.0f)}, &versions);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("dtype must be int64, not float32"), std::string::npos) << wrong;
  EXPECT_EQ(Value("bn/num_batches_tracked").item<int64_t>(), big + 2);
  // A snapshot keeps the dtype and no optimizer.
  for (const SavedVariable& v : store_.Snapshot()) {
    if (v.name != "bn/num_batches_tracked") continue;
    EXPECT_EQ(v.value.scalar_type(), torch::kInt64);
    EXPECT_TRUE(v.optimizer.empty());
    EXPECT_TRUE(v.slots.tensors.empty());
  }
}

// Elastic moves by several threads at once, with locking: each reads and
// moves the value in one step, so the values before them are the chain of
// moves one after another, each exactly once, and none is lost.
TEST(ElasticMoveTest, MovesUnderLockingAreAtomicAndAnswerTheValueBeforeThem) {
  VariableStore store("/job:ps/task:0");
  const int64_t n = 4096;
  ASSERT_TRUE(store.Create({Def("c", {n}, "sgd", 0.5, /*use_locking=*/true)}, {torch::zeros({n})}).ok());
  const torch::Tensor target = torch::full({n}, 1000.0f);
  const int threads = 4, moves = 25;  // 100 moves: every link of the chain still a distinct float
  const double alpha = 0.1;
  std::vector<std::vector<torch::Tensor>> seen(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int m = 0; m < moves; ++m) {
        std::vector<int64_t> versions;
        std::vector<torch::Tensor> before;
        ASSERT_TRUE(store.ApplyGradients({"c"}, {target}, &versions, wire::UPDATE_ELASTIC, alpha, &before).ok());
        seen[t].push_back(before[0]);
      }
    });
  }
  for (auto& w : workers) w.join();
  // The chain, move after move, by the same expression.
  std::map<float, int> chain;  // each element of a value is the same, so its first names it
  torch::Tensor c = torch::zeros({n});
  for (int k = 0; k < threads * moves; ++k) {
    chain[c[0].item<float>()] = k;
    c = c + (target - c) * alpha;
  }
  std::set<int> found;
  for (const auto& values : seen) {
    for (const torch::Tensor& before : values) {
      auto link = chain.find(before[0].item<float>());
      ASSERT_NE(link, chain.end()) << before[0].item<float>();
      EXPECT_TRUE(before.equal(torch::full({n}, link->first)));  // not torn
      found.insert(link->second);
    }
  }
  EXPECT_EQ(found.size(), static_cast<size_t>(threads * moves));  // each link once
  std::vector<torch::Tensor> values;
  std::vector<int64_t> versions;
  ASSERT_TRUE(store.Read({"c"}, &values, &versions).ok());
  EXPECT_TRUE(values[0].equal(c));
}

TEST_F(VariableStoreTest, AnElasticMoveOfABufferOrByABadAlphaIsRefusedAndChangesNothing) {
  ASSERT_TRUE(store_.Create({BufferDef("bn/running_mean", {3}, wire::DTYPE_FLOAT32)}, {torch::zeros({3})}).ok());
  std::vector<int64_t> versions;
  std::vector<torch::Tensor> before;
  absl::Status status =
      store_.ApplyGradients({"bn/running_mean"}, {torch::ones({3})}, &versions, wire::UPDATE_ELASTIC, 0.5, &before);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("elastic copy for 'bn/running_mean'"), std::string::npos) << status;
  for (const double alpha : {0.0, -0.5, 1.0001, std::numeric_limits<double>::infinity()}) {
    status = store_.ApplyGradients({"b"}, {torch::ones({3})}, &versions, wire::UPDATE_ELASTIC, alpha, &before);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << alpha;
    EXPECT_NE(status.message().find("is not in (0, 1]"), std::string::npos) << status;
  }
  // A copy of the wrong shape, beside a good one: neither moves.
  status = store_.ApplyGradients({"b", "w"}, {torch::ones({3}), torch::ones({3, 2})}, &versions,
                                 wire::UPDATE_ELASTIC, 0.5, &before);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(Value("b").equal(torch::zeros({3})));
  EXPECT_TRUE(Value("w").equal(torch::ones({2, 3})));
  EXPECT_TRUE(Value("bn/running_mean").equal(torch::zeros({3})));
}

TEST_F(VariableStoreTest, OnlyBuffersMayBeInt64AndADefinitionMustMatchItsValue) {
  wire::VariableDef trained = Def("counts", {2});
  trained.set_dtype(wire::DTYPE_INT64);
  absl::Status status = store_.Create({trained}, {torch::zeros({2}, torch::kInt64)}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("only buffers may be int64"), std::string::npos) << status;
  status = store_.Create({BufferDef("c", {2}, wire::DTYPE_INT64)}, {torch::zeros({2})}).status();
  EXPECT_NE(status.message().find("initial value must be int64, not float32"), std::string::npos) << status;
  status = store_.Create({BufferDef("c", {2}, static_cast<wire::DType>(9))}, {torch::zeros({2})}).status();
  EXPECT_NE(status.message().find("unknown dtype number 9"), std::string::npos) << status;
  // The same name again as a buffer, or at another dtype, is another definition.
  status = store_.Create({BufferDef("b", {3}, wire::DTYPE_FLOAT32)}, {torch::zeros({3})}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists) << status;
  EXPECT_FALSE(store_.Lookup({"c"})[0].present);
}

TEST_F(VariableStoreTest, CountersStartAtZero) {
  EXPECT_EQ(store_.AddToCounter("global_step", 0), 0);
  EXPECT_EQ(store_.AddToCounter("global_step", 1), 1);
  EXPECT_EQ(store_.AddToCounter("global_step", 2), 3);
}

// Many threads add 1 to every element of a large variable through SGD
// (lr 1, gradient -1). With use_locking every add lands; without it,
// concurrent read-modify-writes of the same elements lose some (Hogwild).
int64_t LostUpdates(bool use_locking) {
  constexpr int kThreads = 4, kApplies = 50;
  constexpr int64_t kSize = 1 << 18;
  VariableStore store("/job:ps/task:0");
  EXPECT_TRUE(store.Create({Def("v", {kSize}, "sgd", 1.0, use_locking)}, {torch::zeros({kSize})}).ok());
  torch::Tensor grad = torch::full({kSize}, -1.0f);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      std::vector<int64_t> versions;
      for (int i = 0; i < kApplies; ++i) EXPECT_TRUE(store.ApplyGradients({"v"}, {grad}, &versions).ok());
    });
  }
  for (auto& t : threads) t.join();
  std::vector<torch::Tensor> values;
  std::vector<int64_t> versions;
  EXPECT_TRUE(store.Read({"v"}, &values, &versions).ok());
  EXPECT_EQ(versions[0], kThreads * kApplies);  // the version counter is atomic either way
  return (kThreads * kApplies - values[0]).sum().item<double>();
}

TEST(VariableStoreLockingTest, UseLockingMakesConcurrentAppliesExact) {
  EXPECT_EQ(LostUpdates(/*use_locking=*/true), 0);
}

TEST(VariableStoreLockingTest, WithoutLockingConcurrentAppliesRace) {
  // Races are likely, not certain, on any one try: allow several.
  int64_t lost = 0;
  for (int attempt = 0; attempt < 20 && lost == 0; ++attempt) lost = LostUpdates(/*use_locking=*/false);
  EXPECT_GT(lost, 0) << "no update was ever lost without use_locking";
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

// Unlocked Adam applies from several threads used to pair one apply's first
// moment with another's second; where the second moment was still near zero,
// a step came out ~1e4 times too large. Adam's step is at most about
// lr * (1 - beta1) / sqrt(1 - beta2) ~ 3.2 lr per apply when m and v agree.
TEST(VariableStoreConcurrencyTest, ConcurrentAdamAppliesStayBounded) {
  VariableStore store("/job:ps/task:0");
  wire::VariableDef def = Def("w", {4096}, "adam");
  def.mutable_optimizer()->set_learning_rate(1e-3);
  ASSERT_TRUE(store.Create({def}, {torch::zeros({4096})}).ok());
  constexpr int kThreads = 4, kApplies = 300;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread touches its own quarter of the elements: the others' v
      // stays zero there.
      torch::Tensor g = torch::zeros({4096});
      g.narrow(0, t * 1024, 1024).fill_(1.0f);
      std::vector<int64_t> versions;
      for (int i = 0; i < kApplies; ++i) ASSERT_TRUE(store.ApplyGradients({"w"}, {g}, &versions).ok());
    });
  }
  for (auto& thread : threads) thread.join();
  std::vector<torch::Tensor> values;
  std::vector<int64_t> versions;
  ASSERT_TRUE(store.Read({"w"}, &values, &versions).ok());
  EXPECT_LT(values[0].abs().max().item<float>(), kApplies * kThreads * 3.2e-3f);
}

}  // namespace
}  // namespace shoal
