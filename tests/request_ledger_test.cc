// Exactly once: the server's ledger of numbered requests, alone and behind
// a VariableService.
#include "shoal/server/request_ledger.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

#include "absl/synchronization/notification.h"
#include "inproc_servers.h"
#include "shoal/client/client.h"
#include "shoal/core/status.h"
#include "shoal/server/variable_service.h"

namespace shoal {
namespace {

wire::ResponseHeader Answer(int64_t value) {
  wire::ResponseHeader header;
  header.mutable_counter()->set_value(value);
  return header;
}

TEST(RequestLedgerTest, ARepeatGetsTheOriginalsAnswer) {
  RequestLedger ledger("/job:ps/task:0");
  auto first = ledger.Begin(7, 1, 1);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->has_value());  // new: the caller applies it
  ledger.Finish(7, 1, Answer(41));
  auto repeat = ledger.Begin(7, 1, 1);
  ASSERT_TRUE(repeat.ok()) << repeat.status();
  ASSERT_TRUE(repeat->has_value());
  EXPECT_EQ((*repeat)->counter().value(), 41);
  // Another client's request 1 is its own.
  auto other = ledger.Begin(8, 1, 1);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->has_value());
}

TEST(RequestLedgerTest, ARepeatThatOvertakesItsOriginalWaitsForItsAnswer) {
  RequestLedger ledger("/job:ps/task:0");
  ASSERT_FALSE(ledger.Begin(7, 3, 1)->has_value());  // the original, being applied
  absl::Notification answered;
  std::optional<wire::ResponseHeader> seen;
  std::thread repeat([&] {
    auto got = ledger.Begin(7, 3, 1);
    if (got.ok()) seen = *got;
    answered.Notify();
  });
  EXPECT_FALSE(answered.WaitForNotificationWithTimeout(absl::Milliseconds(100)));  // it waits
  ledger.Finish(7, 3, Answer(5));
  repeat.join();
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->counter().value(), 5);
}

TEST(RequestLedgerTest, ARepeatWhoseOriginalNeverEndsIsToldToTryAgain) {
  RequestLedger ledger("/job:ps/task:0", RequestLedgerLimits{16, 16, absl::Milliseconds(50)});
  ASSERT_FALSE(ledger.Begin(7, 3, 1)->has_value());
  auto repeat = ledger.Begin(7, 3, 1);
  EXPECT_EQ(repeat.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(repeat.status().message().find("still being applied"), std::string::npos) << repeat.status();
}

TEST(RequestLedgerTest, SettledNumbersAreForgottenAndRefused) {
  RequestLedger ledger("/job:ps/task:0");
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_FALSE(ledger.Begin(7, id, 1)->has_value());
    ledger.Finish(7, id, Answer(static_cast<int64_t>(id)));
  }
  EXPECT_EQ(ledger.size(), 3u);
  // Request 4 says 1 to 3 are answered: the ledger forgets them...
  ASSERT_FALSE(ledger.Begin(7, 4, 4)->has_value());
  EXPECT_EQ(ledger.size(), 1u);
  // ...and a late copy of one of them is refused, not applied again.
  auto late = ledger.Begin(7, 2, 1);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(late.status().message().find("request 2 of client 7 was answered before"), std::string::npos)
      << late.status();
}

TEST(RequestLedgerTest, MemoryIsBoundedPerClientAndInClients) {
  RequestLedger ledger("/job:ps/task:0", RequestLedgerLimits{/*max_clients=*/4, /*max_open_per_client=*/8});
  for (uint64_t id = 1; id <= 8; ++id) ASSERT_FALSE(ledger.Begin(7, id, 1)->has_value());
  auto ninth = ledger.Begin(7, 9, 1);  // a client that never says what is settled
  EXPECT_EQ(ninth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(ninth.status().message().find("8 requests unanswered"), std::string::npos) << ninth.status();
  // Many clients: the least recently heard from are forgotten.
  for (uint64_t client = 100; client < 200; ++client) ASSERT_TRUE(ledger.Begin(client, 1, 1).ok());
  EXPECT_EQ(ledger.size(), 4u);
}

// Overlapping requests of one client, one of them slow: each later one
// lists the slow one as unfinished, so the ledger forgets every other
// answered request, however many, and still refuses their late copies.
TEST(RequestLedgerTest, OneSlowRequestAmongManyHoldsOnlyItsOwnEntry) {
  RequestLedger ledger("/job:ps/task:0", RequestLedgerLimits{16, /*max_open_per_client=*/8});
  ASSERT_FALSE(ledger.Begin(7, 1, SettledNumbers{2, {1}})->has_value());  // slow: never finished here
  for (uint64_t id = 2; id <= 300; ++id) {
    auto begun = ledger.Begin(7, id, SettledNumbers{id + 1, {1, id}});
    ASSERT_TRUE(begun.ok()) << "request " << id << ": " << begun.status();
    ASSERT_FALSE(begun->has_value());
    ledger.Finish(7, id, Answer(static_cast<int64_t>(id)));
  }
  EXPECT_LE(ledger.size(), 2u);
  auto late = ledger.Begin(7, 150, SettledNumbers{151, {1, 150}});  // a late copy, with its own old report
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition) << late.status();
  // The slow one is still a request being applied: its repeat is not new.
  ledger.Finish(7, 1, Answer(1));
  auto repeat = ledger.Begin(7, 1, SettledNumbers{301, {1}});
  ASSERT_TRUE(repeat.ok()) << repeat.status();
  ASSERT_TRUE(repeat->has_value());
  EXPECT_EQ((*repeat)->counter().value(), 1);
  // Once a request says it is answered too, it is forgotten.
  ASSERT_FALSE(ledger.Begin(7, 301, SettledNumbers{302, {301}})->has_value());
  EXPECT_EQ(ledger.size(), 1u);
  EXPECT_EQ(ledger.Begin(7, 1, SettledNumbers{302, {301}}).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Reports arrive in any order; an older one never makes a settled number
// unsettled, nor settles one that a newer report left in flight.
TEST(RequestLedgerTest, ReportsOutOfOrderOnlyEverSettleMore) {
  RequestLedger ledger("/job:ps/task:0");
  ASSERT_FALSE(ledger.Begin(7, 199, SettledNumbers{200, {50, 60, 150, 199}})->has_value());
  // An older report (sent with 60, which arrives late): it covers up to 100.
  ASSERT_FALSE(ledger.Begin(7, 60, SettledNumbers{100, {50, 60}})->has_value());
  // 150 is still in flight (the newer report said so): its arrival is new.
  ASSERT_FALSE(ledger.Begin(7, 150, SettledNumbers{100, {50, 60}})->has_value());
  // 120 was settled by the newer report; an old report listing it cannot revive it.
  EXPECT_EQ(ledger.Begin(7, 120, SettledNumbers{130, {50, 120}}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A report covering 50 without listing it settles it.
  ASSERT_FALSE(ledger.Begin(7, 201, SettledNumbers{202, {150, 199, 201}})->has_value());
  EXPECT_EQ(ledger.Begin(7, 50, SettledNumbers{202, {50}}).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A report that lists its numbers out of order, at or above its bound, or
// too many of them is refused, and the ledger is as it was.
TEST(RequestLedgerTest, AMalformedReportIsRefusedAndChangesNothing) {
  RequestLedger ledger("/job:ps/task:0", RequestLedgerLimits{16, 16, absl::Milliseconds(50)});
  ASSERT_FALSE(ledger.Begin(7, 5, SettledNumbers{6, {5}})->has_value());
  const std::vector<SettledNumbers> malformed = {
      SettledNumbers{100, {7, 6}},
      SettledNumbers{100, {6, 6}},
      SettledNumbers{100, {6, 100}},
      SettledNumbers{5000, [] {
                       std::vector<uint64_t> many(kMaxUnfinishedListed + 1);
                       for (size_t i = 0; i < many.size(); ++i) many[i] = i + 1;
                       return many;
                     }()},
  };
  for (const SettledNumbers& report : malformed) {
    auto refused = ledger.Begin(7, 6, report);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_NE(refused.status().message().find("request 6 of client 7"), std::string::npos) << refused.status();
  }
  EXPECT_EQ(ledger.size(), 1u);  // 5 is still there, unanswered
  auto repeat = ledger.Begin(7, 5, SettledNumbers{6, {5}});
  EXPECT_EQ(repeat.status().code(), absl::StatusCode::kUnavailable) << repeat.status();  // still being applied
}

// A numbered gradient sent twice moves the variable and the global step once.
TEST(RequestLedgerTest, AServiceAppliesARepeatedGradientOnce) {
  VariableService service(VariableServiceOptions{"/job:ps/task:0"});
  Request create;
  auto* def = create.header.mutable_create_variables()->add_variables();
  def->set_name("w");
  def->add_shape(1);
  def->mutable_optimizer()->set_kind("sgd");
  def->mutable_optimizer()->set_learning_rate(1.0);
  create.tensors.push_back(torch::zeros({1}));
  Response response;
  service.Handle(create, &response);
  ASSERT_EQ(response.header.status_code(), 0) << response.header.status_message();

  Request apply;
  apply.header.mutable_apply_gradients()->add_names("w");
  auto* step = apply.header.mutable_apply_gradients()->add_counters();
  step->set_name("global_step");
  step->set_delta(1);
  apply.header.set_client_id(7);
  apply.header.set_request_id(1);
  apply.header.set_first_unfinished_id(1);
  apply.tensors.push_back(torch::ones({1}));
  for (int copy = 0; copy < 3; ++copy) {
    service.Handle(apply, &response);
    ASSERT_EQ(response.header.status_code(), 0) << response.header.status_message();
    EXPECT_EQ(response.header.apply_gradients().counter_values(0), 1) << "copy " << copy;
  }
  EXPECT_EQ(service.store().AddToCounter("global_step", 0), 1);
  std::vector<torch::Tensor> values;
  std::vector<int64_t> versions;
  ASSERT_TRUE(service.store().Read({"w"}, &values, &versions).ok());
  EXPECT_FLOAT_EQ(values[0].item<float>(), -1.0f);

  // The next number is a new update.
  apply.header.set_request_id(2);
  service.Handle(apply, &response);
  EXPECT_EQ(response.header.apply_gradients().counter_values(0), 2);
  // An unnumbered request (an older client) is applied as it comes.
  apply.header.clear_request_id();
  service.Handle(apply, &response);
  service.Handle(apply, &response);
  EXPECT_EQ(service.store().AddToCounter("global_step", 0), 4);

  // A push that asks for the values after it gets them on a repeat too (read
  // then, not recorded), and is still applied once.
  apply.header.set_request_id(3);
  apply.header.mutable_apply_gradients()->set_read_after(true);
  for (int copy = 0; copy < 2; ++copy) {
    service.Handle(apply, &response);
    ASSERT_EQ(response.header.status_code(), 0) << response.header.status_message();
    ASSERT_EQ(response.tensors.size(), 1u) << "copy " << copy;
    EXPECT_FLOAT_EQ(response.tensors[0].item<float>(), -5.0f) << "copy " << copy;
  }
  EXPECT_EQ(service.store().AddToCounter("global_step", 0), 5);

  // An elastic move answers with the value before it; a repeat, whose
  // answer was lost, with the value as it is then. It moves once.
  apply.header.set_request_id(4);
  apply.header.mutable_apply_gradients()->set_read_after(false);
  apply.header.mutable_apply_gradients()->set_rule(wire::UPDATE_ELASTIC);
  apply.header.mutable_apply_gradients()->set_elastic_alpha(0.5);
  apply.tensors = {torch::full({1}, 3.0f)};
  for (int copy = 0; copy < 2; ++copy) {
    service.Handle(apply, &response);
    ASSERT_EQ(response.header.status_code(), 0) << response.header.status_message();
    ASSERT_EQ(response.tensors.size(), 1u) << "copy " << copy;
    EXPECT_FLOAT_EQ(response.tensors[0].item<float>(), copy == 0 ? -5.0f : -1.0f) << "copy " << copy;
  }
  EXPECT_EQ(service.store().AddToCounter("global_step", 0), 6);
  ASSERT_TRUE(service.store().Read({"w"}, &values, &versions).ok());
  EXPECT_FLOAT_EQ(values[0].item<float>(), -1.0f);  // -5 + 0.5 * (3 - -5)
}

// A transport whose first gradient push is held back until released, as
// a thread of the client that lost its core would hold it.
class HoldFirstPush final : public Transport {
 public:
  explicit HoldFirstPush(Transport* inner) : inner_(inner) {}
  ~HoldFirstPush() override {
    Release();
    if (held_.joinable()) held_.join();
  }
  bool holding() const { return holding_; }
  void Release() {
    if (!released_.HasBeenNotified()) released_.Notify();
  }
  absl::StatusOr<std::unique_ptr<ServerHandle>> Serve(const std::string& address, VariableService* service) override {
    return inner_->Serve(address, service);
  }
  absl::StatusOr<std::shared_ptr<Channel>> Connect(const TaskId& task, const std::string& address) override {
    SHOAL_ASSIGN_OR_RETURN(std::shared_ptr<Channel> channel, inner_->Connect(task, address));
    return std::shared_ptr<Channel>(new Holding(std::move(channel), this));
  }

 private:
  class Holding final : public Channel {
   public:
    Holding(std::shared_ptr<Channel> inner, HoldFirstPush* owner)
        : Channel(inner->task()), inner_(std::move(inner)), owner_(owner) {}
    void Call(const Request& request, Response* response, absl::Time deadline,
              std::function<void(absl::Status)> done) override {
      if (!request.header.has_apply_gradients() || owner_->holding_.exchange(true)) {
        inner_->Call(request, response, deadline, std::move(done));
        return;
      }
      owner_->held_ = std::thread([inner = inner_, owner = owner_, request, response, deadline, done] {
        owner->released_.WaitForNotificationWithDeadline(deadline);  // a transport keeps its deadlines
        inner->Call(request, response, deadline, done);
      });
    }

   private:
    std::shared_ptr<Channel> inner_;
    HoldFirstPush* owner_;
  };

  Transport* inner_;
  std::atomic<bool> holding_{false};
  absl::Notification released_;
  std::thread held_;
};

// Through a real client: while one push of a client waits, its other
// threads push many more than the ledger's limit of unanswered requests
// per client; every push is applied once.
TEST(RequestLedgerTest, AClientWithOneSlowPushKeepsPushingPastTheLimit) {
  JobConfig config;
  const ClusterSpec cluster = ClusterSpec::Local(1, 1);
  InProcServers servers(config, cluster);
  HoldFirstPush transport(&servers.transport);
  auto placement = std::make_shared<const Placement>(Placement::Create({{"w", {1}}}, cluster, {}).value());
  auto client = Client::Create(cluster, &transport, placement).value();
  wire::OptimizerConfig sgd;
  sgd.set_kind("sgd");
  sgd.set_learning_rate(1.0);
  ASSERT_TRUE(client->CreateVariables({{"w", torch::zeros({1}), sgd}}).ok());
  std::thread slow([&] { EXPECT_TRUE(client->ApplyGradients({"w"}, {torch::ones({1})}).ok()); });
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!transport.holding() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
  if (!transport.holding()) {
    transport.Release();
    slow.join();
    FAIL() << "the slow push never started";
  }
  constexpr int kPushes = 400;  // over RequestLedgerLimits::max_open_per_client (256)
  absl::Status refused;
  for (int i = 0; i < kPushes && refused.ok(); ++i) {
    auto pushed = client->ApplyGradients({"w"}, {torch::ones({1})});
    if (!pushed.ok()) refused = Annotate(pushed.status(), absl::StrCat("push ", i));
  }
  transport.Release();
  slow.join();
  ASSERT_TRUE(refused.ok()) << refused;
  auto values = client->Read({"w"});
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_FLOAT_EQ((*values)[0].item<float>(), -(kPushes + 1.0f));
}

}  // namespace
}  // namespace shoal
