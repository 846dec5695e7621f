// The same client/server behaviour over every transport: in-process,
// in-process through the wire codec, gRPC on loopback, and UCX (shared
// memory between the threads of this process).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "shoal/client/client.h"
#include "shoal/server/checkpoint_shard.h"
#include "shoal/transport/grpc/grpc_transport.h"
#include "shoal/transport/inproc/inproc_transport.h"
#include "shoal/transport/ucx/ucx_transport.h"
#include "temp_dir.h"

namespace shoal {
namespace {

// kUcx: shared memory between the tasks (one host), with UCX's default two
// lanes (connections_per_peer), which overlapping calls spread over;
// kUcxTcp: UCX told to use TCP only, as between hosts (each message sent
// as one buffer); kUcxOneLane: one connection to each task, one server loop.
enum class Kind { kInProc, kInProcSerialized, kGrpc, kUcx, kUcxTcp, kUcxOneLane };

constexpr size_t kMaxMessageBytes = 4 << 20;

class TransportConformanceTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    switch (GetParam()) {
      case Kind::kInProc:
        transport_ = std::make_unique<InProcTransport>(&network_, InProcOptions{false, kMaxMessageBytes});
        break;
      case Kind::kInProcSerialized:
        transport_ = std::make_unique<InProcTransport>(&network_, InProcOptions{true, kMaxMessageBytes});
        break;
      case Kind::kGrpc:
        transport_ = std::make_unique<GrpcTransport>(GrpcOptions{kMaxMessageBytes, 2});
        break;
      case Kind::kUcx:
      case Kind::kUcxTcp:
      case Kind::kUcxOneLane: {
        UcxOptions options;
        options.max_message_bytes = kMaxMessageBytes;
        if (GetParam() == Kind::kUcxTcp) options.ucx_transports = "tcp";
        if (GetParam() == Kind::kUcxOneLane) options.connections_per_peer = 1;
        transport_ = UcxTransport::Create(options).value();
        break;
      }
    }
    std::map<std::string, std::vector<std::string>> jobs;
    for (const TaskId& task : {TaskId{"ps", 0}, TaskId{"ps", 1}, TaskId{"worker", 0}}) {
      services_[task] =
          std::make_unique<VariableService>(VariableServiceOptions{task.ToString(), kMaxMessageBytes, checkpoint_dir_});
      const bool sockets = GetParam() != Kind::kInProc && GetParam() != Kind::kInProcSerialized;
      std::string address = sockets ? "127.0.0.1:0" : "inproc:" + task.ToString();
      auto server = transport_->Serve(address, services_[task].get());
      ASSERT_TRUE(server.ok()) << server.status();
      jobs[task.job].push_back((*server)->address());
      servers_[task] = *std::move(server);
    }
    cluster_ = ClusterSpec::Create(jobs).value();
    PlacementOptions options;
    options.min_partition_bytes = 1024;  // "big" is partitioned over both ps tasks
    placement_ = std::make_shared<const Placement>(
        Placement::Create({{"small", {3}}, {"big", {64, 8}}, {"other", {2, 2}}}, cluster_, options).value());
    client_ = MakeClient(absl::Seconds(10));
    wire::OptimizerConfig sgd;
    sgd.set_kind("sgd");
    sgd.set_learning_rate(1.0);
    ASSERT_TRUE(client_
                    ->CreateVariables({{"small", torch::zeros({3}), sgd, true},
                                       {"big", torch::arange(512, torch::kFloat32).reshape({64, 8}), sgd, true},
                                       {"other", torch::ones({2, 2}), sgd, false}})
                    .ok());
  }

  std::unique_ptr<Client> MakeClient(absl::Duration timeout) {
    return Client::Create(cluster_, transport_.get(), placement_, ClientOptions{timeout}).value();
  }

  torch::Tensor Read(const std::string& name) {
    auto values = client_->Read({name});
    EXPECT_TRUE(values.ok()) << values.status();
    return values.ok() ? (*values)[0].clone() : torch::Tensor();
  }

  // Where the tasks write checkpoints (one folder for every test of this process).
  const std::string checkpoint_dir_ = FreshTempDir("conformance_", "checkpoints").string();
  InProcNetwork network_;
  std::unique_ptr<Transport> transport_;
  std::map<TaskId, std::unique_ptr<VariableService>> services_;
  std::map<TaskId, std::unique_ptr<ServerHandle>> servers_;
  ClusterSpec cluster_ = ClusterSpec::Local(1, 1);
  std::shared_ptr<const Placement> placement_;
  std::unique_ptr<Client> client_;
};

TEST_P(TransportConformanceTest, ReadsWhatWasCreated) {
  EXPECT_TRUE(Read("small").equal(torch::zeros({3})));
  EXPECT_TRUE(Read("big").equal(torch::arange(512, torch::kFloat32).reshape({64, 8})));
}

TEST_P(TransportConformanceTest, PartitionedVariableIsSplitAcrossPsTasks) {
  auto lookup = services_[{"ps", 0}]->store().Lookup({"big/part_0", "big/part_1"});
  auto lookup1 = services_[{"ps", 1}]->store().Lookup({"big/part_0", "big/part_1"});
  EXPECT_NE(lookup[0].present, lookup1[0].present);
  EXPECT_NE(lookup[1].present, lookup1[1].present);
}

TEST_P(TransportConformanceTest, AppliesAndAssignsAcrossTasks) {
  auto counters = client_->ApplyGradients({"small", "big"}, {torch::full({3}, -2.0f), torch::ones({64, 8})},
                                          {{"global_step", 1}});
  ASSERT_TRUE(counters.ok()) << counters.status();
  EXPECT_EQ(*counters, std::vector<int64_t>{1});
  EXPECT_TRUE(Read("small").equal(torch::full({3}, 2.0f)));
  EXPECT_TRUE(Read("big").equal(torch::arange(512, torch::kFloat32).reshape({64, 8}) - 1));
  ASSERT_TRUE(client_->Assign({"big"}, {torch::full({64, 8}, 5.0f)}).ok());
  EXPECT_TRUE(Read("big").equal(torch::full({64, 8}, 5.0f)));
  EXPECT_EQ(client_->AddToCounter("global_step", 0).value(), 1);
}

TEST_P(TransportConformanceTest, APushAnsweredWithTheValuesAfterItReassemblesEveryShard) {
  auto applied = client_->ApplyGradientsAndRead({"big", "small"}, {torch::ones({64, 8}), torch::full({3}, -2.0f)},
                                                {{"global_step", 1}});
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ(applied->counters, std::vector<int64_t>{1});
  ASSERT_EQ(applied->values.size(), 2u);
  EXPECT_TRUE(applied->values[0].equal(torch::arange(512, torch::kFloat32).reshape({64, 8}) - 1));
  EXPECT_TRUE(applied->values[1].equal(torch::full({3}, 2.0f)));
  EXPECT_TRUE(Read("big").equal(applied->values[0]));
  // A refused push brings nothing back and changes nothing.
  torch::Tensor nan = torch::ones({3});
  nan[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(client_->ApplyGradientsAndRead({"small"}, {nan}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Read("small").equal(torch::full({3}, 2.0f)));
}

TEST_P(TransportConformanceTest, AnElasticMoveAnswersWithTheValuesBeforeItOnEveryShard) {
  const torch::Tensor big = Read("big"), small = Read("small");
  auto moved = client_->MoveTowards({"big", "small"}, {torch::zeros({64, 8}), torch::full({3}, 8.0f)}, 0.25,
                                    {{"global_step", 1}});
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->counters, std::vector<int64_t>{1});
  ASSERT_EQ(moved->values.size(), 2u);
  EXPECT_TRUE(moved->values[0].equal(big));
  EXPECT_TRUE(moved->values[1].equal(small));
  EXPECT_TRUE(Read("big").equal(big * 0.75f));
  EXPECT_TRUE(Read("small").equal(small + (8.0f - small) * 0.25f));
  // A move by an alpha outside (0, 1] is refused, naming it, and changes nothing.
  for (const double alpha : {0.0, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    auto refused = client_->MoveTowards({"small"}, {torch::zeros({3})}, alpha);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << alpha;
    EXPECT_NE(refused.status().message().find("elastic alpha"), std::string::npos) << refused.status();
  }
  EXPECT_TRUE(Read("small").equal(small + (8.0f - small) * 0.25f));
}

TEST_P(TransportConformanceTest, SeveralCountersMoveInOneRequestInOrder) {
  ASSERT_TRUE(client_->AddToCounter("b", 5).ok());
  // Each value is its counter's right after its own delta: "a" read after
  // it was bumped, "b" read as it was.
  auto values = client_->AddToCounters({{"a", 2}, {"b", 0}, {"a", 0}, {"a", 3}});
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, (std::vector<int64_t>{2, 5, 2, 5}));
  EXPECT_EQ(client_->AddToCounter("a", 0).value(), 5);
  EXPECT_TRUE(client_->AddToCounters({}).value().empty());
}

TEST_P(TransportConformanceTest, MessagesWithHeadersLongerThanUcxsHeaderLimitRoundTrip) {
  // 600 variables with long names: a request or answer naming all of them
  // has a header frame over 11 KiB per ps task (UCX carries up to about
  // 8 KiB of it in its active message's header; more goes in the data),
  // one naming one a short frame.
  std::vector<VariableSpec> shapes;
  std::vector<std::string> names;
  std::vector<VariableInit> inits;
  wire::OptimizerConfig sgd;
  sgd.set_kind("sgd");
  sgd.set_learning_rate(1.0);
  for (int i = 0; i < 600; ++i) {
    names.push_back(absl::StrCat("a_variable_with_a_rather_long_name_", i));
    shapes.push_back({names.back(), {2}});
    inits.push_back({names.back(), torch::full({2}, static_cast<float>(i)), sgd, true});
  }
  auto placement = std::make_shared<const Placement>(Placement::Create(shapes, cluster_, PlacementOptions{}).value());
  auto client = Client::Create(cluster_, transport_.get(), placement, ClientOptions{absl::Seconds(10)}).value();
  ASSERT_TRUE(client->CreateVariables(inits).ok());
  auto all = client->Read(names);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), names.size());
  for (int i = 0; i < 600; ++i) EXPECT_TRUE((*all)[i].equal(torch::full({2}, static_cast<float>(i)))) << names[i];
  auto one = client->ApplyGradientsAndRead({names[7]}, {torch::ones({2})});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(one->values[0].equal(torch::full({2}, 6.0f)));
}

TEST_P(TransportConformanceTest, UnknownVariableIsNotFoundNamingTheTask) {
  Request request;
  request.header.mutable_read()->add_names("missing");
  Response response;
  auto channel = transport_->Connect({"ps", 1}, cluster_.AddressOf({"ps", 1}).value()).value();
  absl::Status status = CallAndWait(*channel, request, &response, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(status.message().find("'missing'"), std::string::npos);
  EXPECT_NE(status.message().find("/job:ps/task:1"), std::string::npos) << status;
  EXPECT_EQ(client_->Read({"missing"}).status().code(), absl::StatusCode::kNotFound);
}

TEST_P(TransportConformanceTest, ShapeMismatchChangesNothingAndServerKeepsServing) {
  absl::Status status = client_->ApplyGradients({"small"}, {torch::ones({4})}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("'small'"), std::string::npos) << status;
  EXPECT_EQ(client_->Assign({"big"}, {torch::ones({8, 64})}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Read("small").equal(torch::zeros({3})));
  EXPECT_TRUE(Read("big").equal(torch::arange(512, torch::kFloat32).reshape({64, 8})));
}

TEST_P(TransportConformanceTest, NanGradientIsRefused) {
  torch::Tensor grad = torch::ones({3});
  grad[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(client_->ApplyGradients({"small"}, {grad}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Read("small").equal(torch::zeros({3})));
}

TEST_P(TransportConformanceTest, OversizedMessageIsRefusedAndServerKeepsServing) {
  const int64_t too_many = kMaxMessageBytes / sizeof(float) + 1024;
  Request request;
  request.header.mutable_assign()->add_names("small");
  request.tensors = {torch::zeros({too_many})};
  Response response;
  auto channel = transport_->Connect({"ps", 0}, cluster_.AddressOf({"ps", 0}).value()).value();
  absl::Status status = CallAndWait(*channel, request, &response, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("limit"), std::string::npos) << status;
  EXPECT_TRUE(Read("small").equal(torch::zeros({3})));
}

TEST_P(TransportConformanceTest, DeadTaskIsUnavailableNamingTheTask) {
  servers_.erase({"ps", 1});
  auto client = MakeClient(absl::Seconds(3));
  const absl::Time start = absl::Now();
  absl::Status status = client->Read({"small", "big"}).status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
  EXPECT_TRUE(absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) << status;
  EXPECT_NE(status.message().find("/job:ps/task:1"), std::string::npos) << status;
}

TEST_P(TransportConformanceTest, WaitForVariablesTimesOutNamingWhatIsMissing) {
  PlacementOptions options;
  auto placement = std::make_shared<const Placement>(
      Placement::Create({{"never_created", {1}}}, cluster_, options).value());
  auto client = Client::Create(cluster_, transport_.get(), placement, ClientOptions{absl::Seconds(2)}).value();
  absl::Status status = client->WaitForVariables({"never_created"}, absl::Milliseconds(300));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(status.message().find("never_created"), std::string::npos) << status;
  EXPECT_TRUE(client_->WaitForVariables({"small", "big"}, absl::Seconds(1)).ok());
}

TEST_P(TransportConformanceTest, ConcurrentClientsApplyEveryUpdateWithLocking) {
  constexpr int kThreads = 4, kSteps = 25;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      auto client = MakeClient(absl::Seconds(10));
      for (int i = 0; i < kSteps; ++i) {
        ASSERT_TRUE(client->ApplyGradients({"small", "big"}, {torch::full({3}, -1.0f), torch::full({64, 8}, -1.0f)},
                                           {{"global_step", 1}})
                        .ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(Read("small").equal(torch::full({3}, float{kThreads * kSteps})));
  EXPECT_TRUE(Read("big").equal(torch::arange(512, torch::kFloat32).reshape({64, 8}) + kThreads * kSteps));
  EXPECT_EQ(client_->AddToCounter("global_step", 0).value(), kThreads * kSteps);
}

// One client's calls overlapping on the same channels (each thread's
// answers are its own, every update lands).
TEST_P(TransportConformanceTest, OverlappingCallsOfOneClientEachGetTheirOwnAnswer) {
  constexpr int kThreads = 4, kSteps = 25;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kSteps; ++i) {
        ASSERT_TRUE(client_->ApplyGradients({"big"}, {torch::full({64, 8}, -1.0f)}).ok());
        auto counter = client_->AddToCounter(absl::StrCat("thread_", t), 1);
        ASSERT_TRUE(counter.ok()) << counter.status();
        EXPECT_EQ(*counter, i + 1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(Read("big").equal(torch::arange(512, torch::kFloat32).reshape({64, 8}) + kThreads * kSteps));
}

// Runs `client`'s save of `shards` at `step` on a thread of its own while
// ps:0's save is held at its tables' checkpoint lock (after it wrote the
// task's variables). Finish() lets it go on and waits for its answer; so
// does the destructor, also when a check throws.
class SaveHeldAtPs0 {
 public:
  SaveHeldAtPs0(VariableService& ps0, Client& client, std::map<TaskId, int> shards, int64_t step)
      : held_(ps0.tables().LockForCheckpoint()),
        thread_([this, &client, shards, step] { saved_ = client.SaveShards(shards, step); }) {}
  ~SaveHeldAtPs0() { Finish(); }

  const absl::StatusOr<std::map<TaskId, Client::SavedShard>>& Finish() {
    if (held_.owns_lock()) held_.unlock();
    if (thread_.joinable()) thread_.join();
    return saved_;
  }

 private:
  std::unique_lock<std::mutex> held_;
  absl::StatusOr<std::map<TaskId, Client::SavedShard>> saved_;
  std::thread thread_;  // last: it writes saved_
};

// Whether the shard file `shard` of the checkpoint at `step` is written
// within 10 s.
bool ShardWrittenSoon(const std::string& dir, int64_t step, int shard) {
  const std::filesystem::path path = std::filesystem::path(CheckpointFolder(dir, step)) / ShardFileName(shard);
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!std::filesystem::exists(path) && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  return std::filesystem::exists(path);
}

// A save that takes long (here: held at ps:0's tables' checkpoint lock)
// runs off the transport's serving threads: the calls behind it, on its
// connection and on another client's, are served meanwhile (with one UCX
// lane, they share its one loop).
TEST_P(TransportConformanceTest, ASaveThatTakesLongDoesNotHoldUpTheCallsBehindIt) {
  const TaskId ps0{"ps", 0};
  SaveHeldAtPs0 save(*services_[ps0], *client_, {{ps0, 0}}, 7);
  EXPECT_TRUE(ShardWrittenSoon(checkpoint_dir_, 7, 0)) << "the save never reached ps:0";
  EXPECT_TRUE(Read("big").equal(torch::arange(512, torch::kFloat32).reshape({64, 8})));
  auto other = MakeClient(absl::Seconds(5));
  auto pushed = other->ApplyGradients({"big"}, {torch::ones({64, 8})}, {{"global_step", 1}});
  EXPECT_TRUE(pushed.ok()) << pushed.status();
  const auto& saved = save.Finish();
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_FALSE(saved->at(ps0).wrote_tables);  // ps:0 holds no table
}

// A client asks every task for its shard at once: ps:1 writes its own
// while ps:0's save is held.
TEST_P(TransportConformanceTest, ASaveAsksEveryTaskAtOnce) {
  const TaskId ps0{"ps", 0}, ps1{"ps", 1};
  SaveHeldAtPs0 save(*services_[ps0], *client_, {{ps0, 0}, {ps1, 1}}, 9);
  EXPECT_TRUE(ShardWrittenSoon(checkpoint_dir_, 9, 1)) << "ps:1 waited for ps:0's save";
  const auto& saved = save.Finish();
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->size(), 2u);
}

// A save may take longer than the RPC deadline (a big table shard): its
// answer is given checkpoint_timeout, which still bounds it.
TEST_P(TransportConformanceTest, ASaveMayTakeLongerThanTheRpcDeadlineButNotItsOwn) {
  const TaskId ps0{"ps", 0};
  const bool deadlines_cut_calls = GetParam() != Kind::kInProc && GetParam() != Kind::kInProcSerialized;
  for (const absl::Duration checkpoint_timeout : {absl::Seconds(30), absl::Milliseconds(300)}) {
    auto quick = Client::Create(cluster_, transport_.get(), placement_,
                                ClientOptions{absl::Milliseconds(300), checkpoint_timeout})
                     .value();
    SaveHeldAtPs0 save(*services_[ps0], *quick, {{ps0, 0}}, 8);
    absl::SleepFor(absl::Seconds(1));  // past the RPC deadline
    const auto& saved = save.Finish();
    if (checkpoint_timeout > absl::Seconds(1) || !deadlines_cut_calls) {
      EXPECT_TRUE(saved.ok()) << saved.status();
    } else {
      EXPECT_EQ(saved.status().code(), absl::StatusCode::kDeadlineExceeded) << saved.status();
    }
  }
}

TEST_P(TransportConformanceTest, ShutdownRequestIsDelivered) {
  ASSERT_TRUE(client_->Shutdown({"ps", 1}).ok());
  const TaskId ps0{"ps", 0}, ps1{"ps", 1};
  EXPECT_TRUE(services_[ps1]->shutdown_requested().HasBeenNotified());
  EXPECT_FALSE(services_[ps0]->shutdown_requested().HasBeenNotified());
}

INSTANTIATE_TEST_SUITE_P(AllTransports, TransportConformanceTest,
                         ::testing::Values(Kind::kInProc, Kind::kInProcSerialized, Kind::kGrpc, Kind::kUcx,
                                           Kind::kUcxTcp, Kind::kUcxOneLane),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           switch (info.param) {
                             case Kind::kInProc: return std::string("InProc");
                             case Kind::kInProcSerialized: return std::string("InProcSerialized");
                             case Kind::kGrpc: return std::string("GrpcLoopback");
                             case Kind::kUcx: return std::string("Ucx");
                             case Kind::kUcxTcp: return std::string("UcxTcp");
                             case Kind::kUcxOneLane: return std::string("UcxOneLane");
                           }
                           return std::string("Unknown");
                         });

}  // namespace
}  // namespace shoal
