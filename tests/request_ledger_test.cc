// Exactly once: the server's ledger of numbered requests, alone and behind
// a VariableService.
#include "shoal/server/request_ledger.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

#include "absl/synchronization/notification.h"
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
}

}  // namespace
}  // namespace shoal
