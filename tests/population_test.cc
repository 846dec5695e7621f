// Populations: the policies and explore rules as pure functions, inheriting
// weights and optimizer slots bit for bit, the server's slot and optimizer
// operations, and whole populations (in one process, with data-parallel
// members, and with a member whose task is gone).
#include "shoal/strategy/population_strategy.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "inproc_servers.h"
#include "quick_job.h"
#include "saved_values.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/model/model_factory.h"
#include "shoal/population/lineage.h"
#include "shoal/server/variable_service.h"
#include "shoal/session/local_cluster.h"
#include "shoal/session/task_runner.h"
#include "shoal/transport/inproc/inproc_transport.h"
#include "step_recorder.h"
#include "temp_dir.h"
#include "source_paths.h"

namespace shoal {
namespace {

MemberStatus Rated(int member, double fitness, double loss = 0.5) {
  MemberStatus s{member};
  s.evaluated = true;
  s.fitness = fitness;
  s.loss = loss;
  return s;
}

TEST(PolicyTest, RandomCopiesAUniformlyChosenReachableOtherWithProbabilityP) {
  PopulationConfig config;
  config.policy = "random";
  config.probability = 0.15;
  std::vector<MemberStatus> members = {Rated(0, 0.5), Rated(1, 0.5), Rated(2, 0.5), Rated(3, 0.5)};
  members[2].reachable = false;
  std::mt19937_64 rng(1);
  std::map<int, int> sources;
  int copies = 0;
  for (int i = 0; i < 20000; ++i) {
    ExploitDecision d = DecideExploit(config, 0, members, rng);
    if (!d.exploit) continue;
    ++copies;
    ++sources[d.source];
    EXPECT_FALSE(d.copy_hyperparameters);
  }
  EXPECT_NEAR(copies / 20000.0, 0.15, 0.01);
  EXPECT_EQ(sources.count(0), 0u);  // never itself
  EXPECT_EQ(sources.count(2), 0u);  // never an unreachable member
  EXPECT_NEAR(sources[1] / static_cast<double>(copies), 0.5, 0.05);
}

TEST(PolicyTest, LossThresholdCopiesTheBestWhenAboveTheThresholdOrTheMargin) {
  PopulationConfig config;
  config.policy = "loss_threshold";
  config.loss_threshold = 1.0;
  config.loss_margin = 0.2;
  std::mt19937_64 rng(1);
  auto decide = [&](double my_loss) {
    return DecideExploit(config, 0, {Rated(0, 0.6, my_loss), Rated(1, 0.9, 0.3), Rated(2, 0.7, 0.4)}, rng);
  };
  EXPECT_FALSE(decide(0.45).exploit);  // within the margin of the best's 0.3
  ExploitDecision margin = decide(0.6);
  EXPECT_TRUE(margin.exploit);
  EXPECT_EQ(margin.source, 1);
  EXPECT_TRUE(decide(1.5).exploit);  // over the threshold
  // The best member never copies.
  EXPECT_FALSE(DecideExploit(config, 1, {Rated(0, 0.6, 2.0), Rated(1, 0.9, 1.9)}, rng).exploit);
}

TEST(PolicyTest, TruncationMovesTheBottomQuarterToTheTopQuarterWithHyperparameters) {
  PopulationConfig config;
  config.policy = "truncation";
  config.fraction = 0.25;
  std::vector<MemberStatus> members;
  for (int m = 0; m < 8; ++m) members.push_back(Rated(m, 0.1 * m));  // 7 is best, 0 worst
  std::mt19937_64 rng(1);
  for (int m = 0; m < 8; ++m) {
    ExploitDecision d = DecideExploit(config, m, members, rng);
    EXPECT_EQ(d.exploit, m < 2) << m;
    if (d.exploit) {
      EXPECT_TRUE(d.source == 6 || d.source == 7) << d.source;
      EXPECT_TRUE(d.copy_hyperparameters);
    }
  }
  members[7].reachable = false;  // the top quarter is then 5 and 6; the bottom 0 and 1
  for (int i = 0; i < 50; ++i) {
    ExploitDecision d = DecideExploit(config, 0, members, rng);
    EXPECT_TRUE(d.source == 5 || d.source == 6) << d.source;
  }
}

// The quantile is over the whole population: with a member not yet rated
// nobody decides (a ranking of 2 or 3 would put the worse of two in the
// bottom "quarter"), and a member that copied is ranked by its donor's
// fitness, which it carries until it is measured again.
TEST(PolicyTest, TruncationRanksEveryMemberOrDecidesNothing) {
  PopulationConfig config;
  config.policy = "truncation";
  config.fraction = 0.25;
  std::mt19937_64 rng(1);
  std::vector<MemberStatus> members = {Rated(0, 0.5), Rated(1, 0.6), MemberStatus{2}, Rated(3, 0.8)};
  for (int m = 0; m < 4; ++m) {
    ExploitDecision d = DecideExploit(config, m, members, rng);
    EXPECT_FALSE(d.exploit) << m;
    EXPECT_NE(d.reason.find(m == 2 ? "no fitness of its own yet" : "member 2 has no fitness yet"), std::string::npos)
        << d.reason;
  }
  members[2] = Rated(2, 0.8);  // it copied member 3 and carries its fitness
  for (int m = 0; m < 4; ++m) EXPECT_EQ(DecideExploit(config, m, members, rng).exploit, m == 0) << m;
  members[0] = Rated(0, 0.8);  // then 0 copied too: now 1 is the worst, and the only one to copy
  for (int m = 0; m < 4; ++m) EXPECT_EQ(DecideExploit(config, m, members, rng).exploit, m == 1) << m;
}

// A member copies only a fitter one. With two members, the one that copied
// carries its donor's fitness: the donor, now tied with it and ranked below
// it, would otherwise copy its own values back every round.
TEST(PolicyTest, TruncationNeverCopiesAMemberNoFitterThanItself) {
  PopulationConfig config;
  config.policy = "truncation";
  config.fraction = 0.25;
  std::mt19937_64 rng(1);
  std::vector<MemberStatus> members = {Rated(0, 0.8222), Rated(1, 0.8222)};
  for (int m = 0; m < 2; ++m) {
    ExploitDecision d = DecideExploit(config, m, members, rng);
    EXPECT_FALSE(d.exploit) << m;
    if (m == 1) EXPECT_NE(d.reason.find("tied with the top"), std::string::npos) << d.reason;
  }
  members[0] = Rated(0, 0.83);
  EXPECT_EQ(DecideExploit(config, 1, members, rng).source, 0);
  // Of a top quarter with one fitter and one tied (7 and 0, ranked before
  // the others tied with it), member 6 at the bottom copies only the fitter.
  std::vector<MemberStatus> eight;
  for (int m = 0; m < 8; ++m) eight.push_back(Rated(m, m == 7 ? 0.9 : 0.5));
  for (int i = 0; i < 20; ++i) {
    ExploitDecision d = DecideExploit(config, 6, eight, rng);
    ASSERT_TRUE(d.exploit);
    EXPECT_EQ(d.source, 7);
  }
}

TEST(PolicyTest, TournamentCopiesOnlyWhenTheRivalIsFitter) {
  PopulationConfig config;
  config.policy = "tournament";
  std::mt19937_64 rng(1);
  EXPECT_FALSE(DecideExploit(config, 0, {Rated(0, 0.9), Rated(1, 0.5)}, rng).exploit);
  ExploitDecision d = DecideExploit(config, 0, {Rated(0, 0.4), Rated(1, 0.5)}, rng);
  EXPECT_TRUE(d.exploit);
  EXPECT_EQ(d.source, 1);
  MemberStatus unrated{1};
  EXPECT_FALSE(DecideExploit(config, 0, {Rated(0, 0.4), unrated}, rng).exploit);
}

TEST(PolicyTest, ADonorThatNoLongerBeatsTheCopierWhenMeasuredNowIsNotCopied) {
  PopulationConfig config;
  const MemberStatus mine = Rated(0, 0.80), donor = Rated(1, 0.85);
  for (const std::string policy : {"truncation", "tournament", "loss_threshold"}) {
    config.policy = policy;
    EXPECT_EQ(RefuseStaleDonor(config, mine, donor, Rated(1, 0.86)), "") << policy;
    EXPECT_EQ(RefuseStaleDonor(config, mine, donor, Rated(1, 0.81)), "") << policy;
    // Diverged since it published 0.85: at chance now.
    const std::string refused = RefuseStaleDonor(config, mine, donor, Rated(1, 0.10, 9.8));
    EXPECT_NE(refused.find("member 1 measured 0.1000"), std::string::npos) << refused;
    EXPECT_NE(refused.find("published 0.8500"), std::string::npos) << refused;
    EXPECT_NE(refused.find("this member's 0.8000"), std::string::npos) << refused;
    EXPECT_NE(RefuseStaleDonor(config, mine, donor, Rated(1, 0.80)), "") << policy << ": a tie is no better";
    EXPECT_NE(RefuseStaleDonor(config, mine, donor, Rated(1, 0.9, std::nan(""))).find("diverged"), std::string::npos)
        << policy;
  }
  // random ranks nobody: any donor that has not diverged will do.
  config.policy = "random";
  EXPECT_EQ(RefuseStaleDonor(config, mine, donor, Rated(1, 0.10, 2.3)), "");
  EXPECT_NE(RefuseStaleDonor(config, mine, donor, Rated(1, 0.10, INFINITY)).find("diverged"), std::string::npos);
}

TEST(ExploreTest, ByDefaultPerturbsPastThePriorAsThePaperDoesAndKeepsMomentumBelowOne) {
  PopulationConfig config;
  EXPECT_FALSE(config.explore_clamp);
  config.explore = {"learning_rate", "momentum"};
  config.resample_probability = 0;
  std::mt19937_64 rng(11);
  std::set<double> learning_rates, momenta;
  for (int i = 0; i < 200; ++i) {
    const Hyperparameters e = Explore(config, Hyperparameters{0.09, 0.9, 0, 64}, rng);
    learning_rates.insert(e.learning_rate);
    momenta.insert(e.momentum);
  }
  // x1.2 of 0.09 goes past the prior's 0.1; x1.2 of momentum 0.9 would be
  // 1.08 and stops just below 1.
  EXPECT_EQ(learning_rates, (std::set<double>{0.09 * 0.8, 0.09 * 1.2}));
  EXPECT_EQ(momenta, (std::set<double>{0.9 * 0.8, kMaxMomentum}));
}

TEST(ExploreTest, MultipliesByPointEightOrOnePointTwoOrResamplesFromThePrior) {
  PopulationConfig config;
  config.explore_clamp = true;  // the perturbed values stay inside the priors
  config.explore = {"learning_rate", "momentum", "weight_decay", "batch_size"};
  config.resample_probability = 0.25;
  Hyperparameters h{0.01, 0.9, 1e-4, 64};
  std::mt19937_64 rng(7);
  int resampled = 0;
  for (int i = 0; i < 4000; ++i) {
    Hyperparameters e = Explore(config, h, rng);
    const double ratio = e.learning_rate / h.learning_rate;
    const bool perturbed = std::abs(ratio - 0.8) < 1e-12 || std::abs(ratio - 1.2) < 1e-12;
    if (!perturbed) ++resampled;
    EXPECT_GE(e.learning_rate, 1e-4);
    EXPECT_LE(e.learning_rate, 1e-1);
    EXPECT_GE(e.momentum, 0.5);
    EXPECT_LE(e.momentum, 0.99);
    EXPECT_GE(e.batch_size, 16);
    EXPECT_LE(e.batch_size, 256);
  }
  EXPECT_NEAR(resampled / 4000.0, 0.25, 0.03);
  config.explore = {"learning_rate"};
  Hyperparameters only_lr = Explore(config, h, rng);
  EXPECT_EQ(only_lr.momentum, h.momentum);
  EXPECT_EQ(only_lr.batch_size, h.batch_size);
}

TEST(ExploreTest, InitialDrawsAreLogUniformOverThePrior) {
  PopulationConfig config;
  std::mt19937_64 rng(3);
  int below = 0;
  for (int i = 0; i < 4000; ++i) {
    const double lr = DrawInitial(config, Hyperparameters{0.01, 0, 0, 64}, rng).learning_rate;
    ASSERT_GE(lr, 1e-4);
    ASSERT_LE(lr, 1e-1);
    below += lr < 1e-2;  // log-uniform on [1e-4, 1e-1]: two decades of three
  }
  EXPECT_NEAR(below / 4000.0, 2.0 / 3.0, 0.03);
  config.draw_initial = false;
  EXPECT_EQ(DrawInitial(config, Hyperparameters{0.01, 0, 0, 64}, rng).learning_rate, 0.01);
}

// Two members' variables on one in-process server, trained a little with Adam.
class InheritTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = transport_.Serve("inproc:ps:0", &service_).value();
    const ClusterSpec cluster = ClusterSpec::Local(1, 1);
    auto placement = std::make_shared<const Placement>(
        Placement::Create({{"worker_0/w", {3, 2}}, {"worker_1/w", {3, 2}}, {"worker_0/bn/mean", {4}},
                           {"worker_0/bn/count", {}}, {"worker_1/bn/mean", {4}}, {"worker_1/bn/count", {}}},
                          cluster, {})
            .value());
    client_ = Client::Create(cluster, &transport_, placement).value();
    wire::OptimizerConfig adam;
    adam.set_kind("adam");
    adam.set_learning_rate(0.1);
    ASSERT_TRUE(client_->CreateVariables({{"worker_0/w", torch::randn({3, 2}), adam},
                                          {"worker_1/w", torch::randn({3, 2}), adam}})
                    .ok());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(client_->ApplyGradients({"worker_0/w"}, {torch::randn({3, 2})}).ok());
    ASSERT_TRUE(client_->ApplyGradients({"worker_1/w"}, {torch::randn({3, 2})}).ok());
  }
  InProcNetwork network_;
  InProcTransport transport_{&network_};
  VariableService service_{VariableServiceOptions{"/job:ps/task:0"}};
  std::unique_ptr<ServerHandle> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(InheritTest, CopiesWeightsAndSlotsBitForBit) {
  ASSERT_TRUE(InheritMember(*client_, *client_, {"worker_0/w"}, {"worker_1/w"}, /*with_slots=*/true).ok());
  auto values = client_->Read({"worker_0/w", "worker_1/w"}).value();
  EXPECT_TRUE(values[0].equal(values[1]));
  auto slots = client_->ReadSlots({"worker_0/w", "worker_1/w"}).value();
  ASSERT_EQ(slots[0].tensors.size(), 2u);  // Adam's m and v
  EXPECT_EQ(slots[0].step, 3);
  EXPECT_EQ(slots[1].step, 3);
  for (size_t k = 0; k < 2; ++k) EXPECT_TRUE(slots[0].tensors[k].equal(slots[1].tensors[k])) << k;
  // The same gradient now moves both the same way.
  torch::Tensor g = torch::randn({3, 2});
  ASSERT_TRUE(client_->ApplyGradients({"worker_0/w", "worker_1/w"}, {g, g}).ok());
  values = client_->Read({"worker_0/w", "worker_1/w"}).value();
  EXPECT_TRUE(values[0].equal(values[1]));
}

// A copier measures the state it read and copies that same state, even
// when the donor trains on in between: the in-process read does not alias
// the donor's memory.
TEST_F(InheritTest, AStateReadOnceIsWhatIsWrittenEvenIfTheDonorMovesOn) {
  const MemberState read = ReadMemberState(*client_, {"worker_0/w"}, /*with_slots=*/true).value();
  const torch::Tensor donor_then = client_->Read({"worker_0/w"}).value()[0].clone();
  ASSERT_TRUE(client_->ApplyGradients({"worker_0/w"}, {torch::ones({3, 2})}).ok());
  ASSERT_TRUE(WriteMemberState(*client_, read, {"worker_1/w"}).ok());
  auto values = client_->Read({"worker_0/w", "worker_1/w"}).value();
  EXPECT_TRUE(values[1].equal(donor_then));
  EXPECT_FALSE(values[1].equal(values[0]));  // the donor moved on; the copy did not follow
  auto slots = client_->ReadSlots({"worker_0/w", "worker_1/w"}).value();
  EXPECT_EQ(slots[0].step, 4);
  EXPECT_EQ(slots[1].step, 3);  // the slots as read
}

TEST_F(InheritTest, WeightsOnlyLeaveTheSlots) {
  auto before = client_->ReadSlots({"worker_1/w"}).value();
  ASSERT_TRUE(InheritMember(*client_, *client_, {"worker_0/w"}, {"worker_1/w"}, /*with_slots=*/false).ok());
  auto after = client_->ReadSlots({"worker_1/w"}).value();
  EXPECT_EQ(after[0].step, 1);
  EXPECT_TRUE(after[0].tensors[0].equal(before[0].tensors[0]));
}

TEST_F(InheritTest, BuffersAreCopiedWithTheWeights) {
  ASSERT_TRUE(client_
                  ->CreateVariables({{"worker_0/bn/mean", torch::randn({4}), {}, false, /*buffer=*/true},
                                     {"worker_0/bn/count", torch::tensor(int64_t{41}), {}, false, /*buffer=*/true},
                                     {"worker_1/bn/mean", torch::zeros({4}), {}, false, /*buffer=*/true},
                                     {"worker_1/bn/count", torch::tensor(int64_t{3}), {}, false, /*buffer=*/true}})
                  .ok());
  ASSERT_TRUE(InheritMember(*client_, *client_, {"worker_0/w"}, {"worker_1/w"}, /*with_slots=*/true,
                            {"worker_0/bn/mean", "worker_0/bn/count"}, {"worker_1/bn/mean", "worker_1/bn/count"})
                  .ok());
  auto values = client_->Read({"worker_0/bn/mean", "worker_1/bn/mean", "worker_1/bn/count"}).value();
  EXPECT_TRUE(values[0].equal(values[1]));
  EXPECT_EQ(values[2].item<int64_t>(), 41);
}

TEST_F(InheritTest, SetOptimizerKeepsTheSlotsAndRefusesAnotherKind) {
  wire::OptimizerConfig adam;
  adam.set_kind("adam");
  adam.set_learning_rate(0.5);
  auto before = client_->ReadSlots({"worker_0/w"}).value();
  ASSERT_TRUE(client_->SetOptimizer({"worker_0/w"}, adam).ok());
  auto after = client_->ReadSlots({"worker_0/w"}).value();
  EXPECT_TRUE(after[0].tensors[1].equal(before[0].tensors[1]));
  wire::OptimizerConfig sgd;
  sgd.set_kind("sgd");
  absl::Status refused = client_->SetOptimizer({"worker_0/w"}, sgd);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("its optimizer is 'adam'"), std::string::npos) << refused;
}

TEST_F(InheritTest, MalformedSlotsAreRefusedAndChangeNothing) {
  auto before = client_->ReadSlots({"worker_1/w"}).value();
  OptimizerSlots wrong_count;
  wrong_count.tensors = {torch::zeros({3, 2})};
  EXPECT_EQ(client_->AssignSlots({"worker_1/w"}, {wrong_count}).code(), absl::StatusCode::kInvalidArgument);
  OptimizerSlots wrong_shape;
  wrong_shape.tensors = {torch::zeros({2, 3}), torch::zeros({3, 2})};
  absl::Status shape = client_->AssignSlots({"worker_1/w"}, {wrong_shape});
  EXPECT_NE(shape.message().find("slot 0 must be float32 of shape [3,2]"), std::string::npos) << shape;
  OptimizerSlots nan;
  nan.tensors = {torch::full({3, 2}, NAN), torch::zeros({3, 2})};
  EXPECT_EQ(client_->AssignSlots({"worker_1/w"}, {nan}).code(), absl::StatusCode::kInvalidArgument);
  auto after = client_->ReadSlots({"worker_1/w"}).value();
  EXPECT_TRUE(after[0].tensors[0].equal(before[0].tensors[0]));
  EXPECT_EQ(after[0].step, before[0].step);
}

JobConfig QuickPopulation(int workers, const std::string& lineage_dir) {
  JobConfig config = QuickJob("population");
  config.cluster.ps = 1;
  config.cluster.workers = workers;
  config.training.epochs = 1;
  config.training.optimizer.Clear();
  config.training.optimizer.set_kind("momentum");
  config.training.optimizer.set_learning_rate(0.01);
  config.population.eval_steps = 20;
  config.population.validation_examples = 2000;
  config.population.lineage_dir = lineage_dir;
  return config;
}

TEST(PopulationTrainingTest, FourMembersInProcessLearnAndLeaveALineage) {
  const std::string dir = FreshTempDir("shoal_", "pop");
  JobConfig config = QuickPopulation(4, dir);
  config.population.inherit_slots = true;
  auto report = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->members.size(), 4u);
  double best = 0;
  for (const auto& m : report->members) best = std::max(best, m.fitness);
  EXPECT_EQ(report->members[report->best_member].fitness, best);
  EXPECT_GT(report->test_accuracy, 0.7);
  auto events = ReadLineage(dir);
  ASSERT_TRUE(events.ok()) << events.status();
  int exploits = 0;
  for (const auto& e : *events) exploits += e.event == "exploit";
  EXPECT_GT(exploits, 0);  // truncation over 4 members every 20 steps copies
  EXPECT_GT(report->peer_bytes_read, 0);
  EXPECT_TRUE(std::filesystem::exists(dir + "/lineage.svg"));
  EXPECT_NE(report->population_summary.find("member 3: fitness"), std::string::npos) << report->population_summary;
  std::filesystem::remove_all(dir);
}

// Members of the built-in CNN with BatchNorm: each keeps its own statistics
// under its scope, published by its lead, and the population learns.
TEST(PopulationTrainingTest, CnnMembersLearnAndKeepTheirOwnStatistics) {
  const std::string dir = FreshTempDir("shoal_", "pop_cnn");
  JobConfig config = QuickPopulation(2, dir + "/lineage");
  config.model.kind = "cnn";
  config.model.cnn.conv = {{8}, {16}};
  config.model.cnn.dense = {32};
  config.training.optimizer.set_learning_rate(0.05);
  config.checkpoint.dir = dir + "/ckpt";
  ASSERT_TRUE(ValidateJobConfig(config).ok()) << ValidateJobConfig(config);
  auto report = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_GT(report->test_accuracy, 0.6);  // measured 0.746 and 0.777; chance is 0.1
  const auto saved = SavedValues(report->last_checkpoint);
  for (const std::string name : {"worker_0/bn_1/num_batches_tracked", "worker_1/bn_1/num_batches_tracked"}) {
    ASSERT_TRUE(saved.count(name)) << name;
    EXPECT_GT(saved.at(name).item<int64_t>(), 0) << name << ": the lead never published its statistics";
  }
  std::filesystem::remove_all(dir);
}

// A population started again over its checkpoint: each member's lead
// restores its own variables, slots, hyper-parameters and member step (a
// fresh start would draw new hyper-parameters), and every member goes on
// from there to its longer budget.
TEST(PopulationTrainingTest, AStartedAgainPopulationResumesEveryMemberFromItsCheckpoint) {
  const std::string dir = FreshTempDir("shoal_", "pop_resume");
  JobConfig config = QuickPopulation(2, dir + "/lineage");
  config.training.max_steps = 80;  // 40 member steps each
  config.checkpoint.dir = dir + "/checkpoints";
  config.checkpoint.every_steps = 1000;  // only the save at the end
  auto first = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->restored_from.empty());
  auto before = ReadLineage(dir + "/lineage");
  ASSERT_TRUE(before.ok()) << before.status();
  std::map<int, LineageEvent> ended;
  for (const auto& e : *before) {
    if (e.event == "end") ended[e.member] = e;
  }
  ASSERT_EQ(ended.size(), 2u);

  config.training.max_steps = 160;
  config.training.seed += 1;  // a fresh start would draw other hyper-parameters
  auto second = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->restored_from, first->last_checkpoint);
  EXPECT_EQ(second->restores, 2);  // one per member
  EXPECT_EQ(second->global_step, 160);
  auto after = ReadLineage(dir + "/lineage");
  ASSERT_TRUE(after.ok()) << after.status();
  for (const auto& [member, end] : ended) {
    bool resumed = false;
    for (const auto& e : *after) {
      if (e.member != member || e.event != "start" || e.step == 0) continue;
      resumed = true;
      EXPECT_EQ(e.step, end.step) << "member " << member;
      // (kept on the ps in float32)
      const Hyperparameters& got = e.hyperparameters;
      const Hyperparameters& saved = end.hyperparameters;
      EXPECT_NEAR(got.learning_rate, saved.learning_rate, 1e-6 * saved.learning_rate) << "member " << member;
      EXPECT_NEAR(got.momentum, saved.momentum, 1e-6) << "member " << member;
      EXPECT_NEAR(got.weight_decay, saved.weight_decay, 1e-6 * std::max(saved.weight_decay, 1e-6))
          << "member " << member;
      EXPECT_EQ(got.batch_size, saved.batch_size) << "member " << member;
    }
    EXPECT_TRUE(resumed) << "member " << member << " started afresh";
  }
  std::filesystem::remove_all(dir);
}

// A population started again over its checkpoint: each member reads its
// data on from where it left it, through exploits and restarts, so one pass
// stays one pass. Each member's shard of 100 examples (120 less 20 for
// validation) in batches of 30 ends each epoch with a batch of 10, which
// shows where in its epoch a step is.
TEST(PopulationTrainingTest, AStartedAgainMemberReadsItsDataOnFromWhereItLeftIt) {
  const std::string dir = FreshTempDir("shoal_", "pop_position");
  JobConfig config = QuickPopulation(2, dir + "/lineage");
  config.data.train_examples = 120;
  config.population.validation_examples = 20;
  config.population.eval_steps = 2;  // exploits on the way
  config.training.batch_size = 30;
  config.training.max_steps = 10;  // 5 member steps each: 30, 30, 30, 10 | 30: 130 examples drawn
  config.checkpoint.dir = dir + "/checkpoints";
  config.checkpoint.every_steps = 1000;  // only the save at the end
  auto positions = [&](const std::string& checkpoint) {
    const CheckpointIndex index = ReadCheckpointIndex(checkpoint).value();
    return std::vector<int64_t>{index.counters.at(DataPositionCounter(0, 2)),
                                index.counters.at(DataPositionCounter(1, 2))};
  };
  std::vector<std::vector<int64_t>> sizes;
  auto first = TrainRecordingBatchSizes(config, &sizes);
  ASSERT_TRUE(first.ok()) << first.status();
  for (int w = 0; w < 2; ++w) EXPECT_EQ(sizes[w], (std::vector<int64_t>{30, 30, 30, 10, 30})) << "member " << w;
  EXPECT_EQ(positions(first->last_checkpoint), (std::vector<int64_t>{130, 130}));

  config.training.max_steps = 18;  // 9 each
  auto second = TrainRecordingBatchSizes(config, &sizes);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->restored_from, first->last_checkpoint);
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(sizes[w], (std::vector<int64_t>{30, 30, 10, 30})) << "member " << w;  // from the 130th example on
  }
  EXPECT_EQ(positions(second->last_checkpoint), (std::vector<int64_t>{230, 230}));

  // Other data (80 examples a member: 30, 30, 20) starts afresh, not 230
  // examples in, which would draw 30, 20 first.
  config.data.train_examples = 100;
  config.training.max_steps = 24;  // 12 each
  auto third = TrainRecordingBatchSizes(config, &sizes);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->restored_from, second->last_checkpoint);
  for (int w = 0; w < 2; ++w) EXPECT_EQ(sizes[w], (std::vector<int64_t>{30, 30, 20})) << "member " << w;
  EXPECT_EQ(positions(third->last_checkpoint), (std::vector<int64_t>{80, 80}));
  std::filesystem::remove_all(dir);
}

// A live 4-member truncation run, checked from its lineage files alone:
// every decision ranked all four members by fitness from the current round
// (each value one that member really published at that step, a copier's
// being its donor's), every copier was the worst of what it saw (the bottom
// quarter of four), and no member outside it copied.
TEST(PopulationTrainingTest, TruncationCopiersAreTheBottomQuarterOfEveryMembersLatestFitness) {
  const std::string dir = FreshTempDir("shoal_", "pop_trunc");
  JobConfig config = QuickPopulation(4, dir);
  config.population.policy = "truncation";
  config.population.fraction = 0.25;
  auto report = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  auto events = ReadLineage(dir);
  ASSERT_TRUE(events.ok()) << events.status();
  // What each member published, by (member, step): its measurements and,
  // after a copy, its donor's fitness as it measured it then.
  std::map<std::pair<int, int64_t>, std::vector<double>> published;
  for (const auto& e : *events) {
    if (e.event == "eval" || e.event == "exploit") published[{e.member, e.step}].push_back(e.fitness);
  }
  int decisions = 0, copies = 0;
  for (const auto& e : *events) {
    if (e.event != "exploit" && e.event != "keep") continue;
    ++decisions;
    const std::string at = "member " + std::to_string(e.member) + " at step " + std::to_string(e.step);
    ASSERT_EQ(e.seen.size(), 4u) << at;
    const int64_t round = e.step / config.population.eval_steps * config.population.eval_steps;
    for (int m = 0; m < 4; ++m) {
      ASSERT_GE(e.seen[m], 0) << at << ": member " << m << " was not ranked";
      EXPECT_GE(e.seen_steps[m], round) << at << ": member " << m << "'s fitness is from an earlier round";
      if (m == e.member) continue;
      const auto& values = published[{m, e.seen_steps[m]}];
      EXPECT_TRUE(std::any_of(values.begin(), values.end(), [&](double v) { return std::abs(v - e.seen[m]) < 1e-6; }))
          << at << ": member " << m << " never published fitness " << e.seen[m] << " at step " << e.seen_steps[m];
    }
    const double mine = e.seen[e.member];
    int lower = 0, lower_or_tied = 0;
    for (int m = 0; m < 4; ++m) {
      if (m == e.member) continue;
      lower += e.seen[m] < mine;
      lower_or_tied += e.seen[m] <= mine;
    }
    if (e.event == "exploit") {
      ++copies;
      EXPECT_EQ(lower, 0) << at << " copied but was not the worst";
    } else if (e.reason.find("not copied: ") == std::string::npos) {  // else its donor, measured now, was no better
      EXPECT_GT(lower_or_tied, 0) << at << " was the worst and did not copy";
    }
  }
  EXPECT_GE(decisions, 4 * 5);  // about 7 rounds of 20 steps per member
  EXPECT_GT(copies, 0);
  EXPECT_EQ(report->copies, copies);
  EXPECT_EQ(report->copies_by_the_worst, copies);
  std::string histogram;
  for (int64_t n : report->copies_per_interval) histogram += std::to_string(n) + " ";
  std::printf("ready intervals with 0, 1, 2, ... copies: %s\n", histogram.c_str());
  std::filesystem::remove_all(dir);
}

// A free run of 4 members, truncation at q = 0.25 (floor(0.25 x 4) = 1
// member in the bottom set), a decision every 10 member steps, over 21
// intervals: in every interval every decision ranks the members by the
// same fitness, the one each measured for it, and at most one member
// copies, the one in the bottom set by it. (A copier that carried its
// donor's fitness pushed another member into the bottom set in the same
// interval: 2 or 3 copies in 40 of 240 intervals.)
TEST(PopulationTrainingTest, TruncationCopiesAtMostTheBottomQuantileInEveryInterval) {
  const std::string dir = FreshTempDir("shoal_", "pop_quantile");
  JobConfig config = QuickPopulation(4, dir);
  config.population.policy = "truncation";
  config.population.fraction = 0.25;
  config.population.eval_steps = 10;
  config.population.ready_steps = 10;
  config.population.validation_examples = 1000;
  config.training.max_steps = 4 * 215;
  auto report = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  auto events = ReadLineage(dir);
  ASSERT_TRUE(events.ok()) << events.status();
  struct Interval {
    std::vector<const LineageEvent*> decisions;
    int copies = 0;
  };
  std::map<int64_t, Interval> intervals;
  for (const auto& e : *events) {
    if (e.event != "exploit" && e.event != "keep") continue;
    Interval& interval = intervals[e.step / 10];
    interval.decisions.push_back(&e);
    interval.copies += e.event == "exploit";
  }
  EXPECT_GE(intervals.size(), 20u);
  std::map<int, int> histogram;
  for (const auto& [index, interval] : intervals) {
    const std::string at = "interval at step " + std::to_string(index * 10);
    ++histogram[interval.copies];
    EXPECT_LE(interval.copies, 1) << at;
    EXPECT_EQ(interval.decisions.size(), 4u) << at;
    for (const LineageEvent* e : interval.decisions) {
      ASSERT_EQ(e->seen.size(), 4u) << at;
      EXPECT_EQ(e->seen, interval.decisions.front()->seen) << at << ": member " << e->member
                                                           << " ranked by other fitness than member "
                                                           << interval.decisions.front()->member;
      for (int64_t measured_at : e->seen_steps) EXPECT_EQ(measured_at, index * 10) << at;
      if (e->event != "exploit") continue;
      // The bottom set as the policy ranks: best first, ties in member order.
      std::vector<int> ranked = {0, 1, 2, 3};
      std::stable_sort(ranked.begin(), ranked.end(), [&](int a, int b) { return e->seen[a] > e->seen[b]; });
      EXPECT_EQ(ranked.back(), e->member) << at << ": member " << e->member << " copied outside the bottom set";
    }
  }
  std::string counts;
  for (const auto& [copies, n] : histogram) counts += std::to_string(copies) + ": " + std::to_string(n) + "  ";
  std::printf("ready intervals by copies made in them: %s\n", counts.c_str());
  std::filesystem::remove_all(dir);
}

// A member whose weights blew up since it was last measured still shows
// the fitness it had. Here (random policy, a copy every step) member 1
// parks after step `round`; member 0 then gives it weights whose loss is
// infinite (zero, and an output bias of +-3e38: finite values, which the
// ps takes), decides after its own step `round`, and then puts member 1's
// weights back and lets it go on. Member 0 must measure member 1 before
// copying it, and keep its own.
TEST(PopulationTrainingTest, ADonorWhoseWeightsBlewUpIsMeasuredAndNotCopied) {
  const std::string dir = FreshTempDir("shoal_", "pop_stale");
  JobConfig config = QuickPopulation(2, dir);
  config.population.policy = "random";
  config.population.probability = 1;
  const int64_t round = 20;
  auto model = MakeModel(MemberModel(config, 1));
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<std::string> donor = (*model)->variable_names();
  std::atomic<bool> parked{false}, decided{false};
  std::vector<torch::Tensor> saved;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  auto customize = [&](WorkerContext& context) {
    Client* client = context.client;
    if (context.worker_index == 1) {
      context.before_step = [&](int64_t done) {
        if (done != round) return;
        parked = true;
        while (!decided && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
      };
      return;
    }
    context.before_step = [&, client](int64_t done) {
      if (done == round - 1) {
        while (!parked && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
        auto values = client->Read(donor);
        ASSERT_TRUE(values.ok()) << values.status();
        std::vector<torch::Tensor> blown;
        for (const torch::Tensor& v : *values) {
          saved.push_back(v.clone());
          blown.push_back(torch::zeros_like(v));
        }
        blown.back().fill_(-3e38f);  // the output layer's bias: every logit -3e38 but one
        blown.back()[0] = 3e38f;
        ASSERT_TRUE(client->Assign(donor, blown).ok());
      }
      if (done == round && parked) {  // member 0 decided after step `round`
        ASSERT_TRUE(client->Assign(donor, saved).ok());
        decided = true;
      }
    };
  };
  auto report = TrainInProcess(config, InProcOptions{}, nullptr, customize);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_TRUE(decided);
  auto events = ReadLineage(dir);
  ASSERT_TRUE(events.ok()) << events.status();
  int decisions = 0;
  for (const auto& e : *events) {
    if (e.member != 0 || e.step != round || (e.event != "keep" && e.event != "exploit")) continue;
    ++decisions;
    EXPECT_EQ(e.event, "keep") << "member 0 copied member 1's blown-up weights: " << e.reason;
    EXPECT_NE(e.reason.find("not copied: member 1 measured"), std::string::npos) << e.reason;
    EXPECT_NE(e.reason.find("diverged"), std::string::npos) << e.reason;
  }
  EXPECT_EQ(decisions, 1) << "member 0's decisions at step " << round;
  EXPECT_GT(report->copies, 0) << "with probability 1 the other steps copy";
  std::filesystem::remove_all(dir);
}

TEST(PopulationTrainingTest, DataParallelMembersShareTheirVariablesThroughThePs) {
  const std::string dir = FreshTempDir("shoal_", "pop_dp");
  JobConfig config = QuickPopulation(4, dir);
  config.population.workers_per_member = 2;
  config.population.variables_on = "ps";
  auto report = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->members.size(), 2u);
  // Each member learned, its two workers training one copy of its variables
  // on the ps: each evaluated above 0.7 at some point. Not necessarily at
  // the end: an explore late in the run may resample a member's learning
  // rate (measured: to 0.098, 14 steps before the end, under a CPU load),
  // with no evaluation left for an exploit to undo it.
  EXPECT_GT(report->members[report->best_member].fitness, 0.7);
  auto events = ReadLineage(dir);
  ASSERT_TRUE(events.ok()) << events.status();
  std::vector<double> best_evaluated(2, 0);
  for (const auto& e : *events) {
    if (e.event == "eval") best_evaluated[e.member] = std::max(best_evaluated[e.member], e.fitness);
  }
  for (int member = 0; member < 2; ++member) EXPECT_GT(best_evaluated[member], 0.7) << member;
  std::filesystem::remove_all(dir);
}

TEST(PopulationTrainingTest, ValidationIsCarvedFromTheTrainingSetAndNeverTrainedOn) {
  JobConfig config = QuickPopulation(2, "unused");
  const Dataset train{torch::arange(100).view({100, 1}).to(torch::kFloat32), torch::arange(100)};
  config.population.validation_examples = 30;
  const ClusterSpec cluster = ClusterSpec::Local(1, 2);
  WorkerContext context = MakeWorkerContext(config, cluster, TaskId{"worker", 1}, nullptr, train, 10);
  EXPECT_EQ(context.validation.size(), 30);
  EXPECT_EQ(context.train_shard.size(), 70);  // each member trains on all the rest
  EXPECT_EQ(context.validation.labels[0].item<int64_t>(), 70);
  EXPECT_LT(context.train_shard.labels.max().item<int64_t>(), 70);
}

// Members 0-2 train while member 3's task never comes up: its variables
// cannot be read, and the policy skips it.
TEST(PopulationTrainingTest, AnUnreachableMemberIsSkipped) {
  const std::string dir = FreshTempDir("shoal_", "pop_gone");
  JobConfig config = QuickPopulation(4, dir);
  config.population.policy = "tournament";
  config.population.peer_timeout_s = 1;
  config.training.max_steps = 4 * 60;
  const ClusterSpec cluster = ClusterSpec::Local(1, 4);
  auto data = LoadData(config).value();
  InProcServers servers(config, cluster, {TaskId{"worker", 3}});  // member 3's task never starts
  InProcTransport& transport = servers.transport;
  auto placement = MakePlacement(config, cluster).value();
  std::vector<absl::StatusOr<WorkerResult>> results(3, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      auto client = Client::Create(cluster, &transport, placement).value();
      WorkerContext context = MakeWorkerContext(config, cluster, TaskId{"worker", w}, client.get(), data.train,
                                                config.training.max_steps);
      results[w] = PopulationStrategy().RunWorker(context);
    });
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < 3; ++w) EXPECT_TRUE(results[w].ok()) << w << ": " << results[w].status();
  std::filesystem::remove_all(dir);
}

TEST(LineageTest, AGarbledRecordIsDataLossNamingFileAndLine) {
  const std::filesystem::path dir = FreshTempDir("shoal_", "bad_lineage");
  std::ofstream(dir / "member_0.jsonl") << "{\"member\": 0, \"step\": \n";
  auto events = ReadLineage(dir.string());
  EXPECT_EQ(events.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(events.status().message().find("member_0.jsonl' line 1"), std::string::npos) << events.status();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

// Every member its own process over gRPC: members read each other's
// variables across processes, and each serves its own until the chief has
// reported.
TEST(PopulationTrainingTest, MembersInSeparateProcessesReadEachOtherOverGrpc) {
  const std::string dir = FreshTempDir("shoal_", "pop_grpc");
  JobConfig config = QuickPopulation(3, dir);
  config.cluster.processes = true;
  config.population.policy = "tournament";
  auto report = TrainInLocalProcesses(config, SHOAL_BINARY, /*show_progress=*/false);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->members.size(), 3u);
  for (const auto& m : report->members) EXPECT_GT(m.test_accuracy, 0.6) << m.member;
  EXPECT_GT(report->peer_bytes_read, 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

// Copying at random every step reads peers' weights over and over; a cache
// with a staleness bound serves most of those reads locally.
TEST(PopulationTrainingTest, APeerCacheCutsTheBytesMoved) {
  const std::string dir = FreshTempDir("shoal_", "pop_cache");
  JobConfig config = QuickPopulation(2, dir);
  config.population.policy = "random";
  config.population.probability = 0.5;
  config.training.max_steps = 2 * 100;
  auto uncached = TrainInProcess(config, InProcOptions{}, nullptr);
  config.population.peer_cache_steps = 1000;
  auto cached = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(uncached.ok() && cached.ok());
  EXPECT_LT(cached->peer_bytes_read * 5, uncached->peer_bytes_read)
      << cached->peer_bytes_read << " vs " << uncached->peer_bytes_read;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shoal
