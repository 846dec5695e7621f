// Leased data: the lease table, the once-and-in-order rule, the ledger and
// its check (server/data_leases.h), and jobs trained on leased data whose
// every example of every finished epoch is applied exactly once.
#include "shoal/server/data_leases.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "quick_job.h"
#include "stalls.h"
#include "temp_dir.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/checkpoint/lease_restore.h"
#include "shoal/config/config.h"
#include "shoal/server/variable_service.h"
#include "shoal/session/local_cluster.h"
#include "shoal/strategy/leased_data.h"
#include "shoal/strategy/training_mode.h"

namespace shoal {
namespace {

constexpr int64_t kFingerprint = 77;

wire::LeaseRequest Ask(const std::string& worker, int64_t examples = 100, int64_t shard_examples = 40) {
  wire::LeaseRequest request;
  request.set_worker(worker);
  request.set_data_fingerprint(kFingerprint);
  request.set_examples(examples);
  request.set_shard_examples(shard_examples);
  request.set_timeout_ms(1000);
  return request;
}

wire::DataProgress Places(const wire::LeaseResponse& lease, int64_t begin, int64_t end) {
  wire::DataProgress progress;
  progress.set_lease(lease.lease());
  progress.set_epoch(lease.epoch());
  progress.set_shard(lease.shard());
  progress.set_shard_begin(lease.shard() * 40);
  progress.set_begin(begin);
  progress.set_end(end);
  return progress;
}

// Admits and, when told to apply, commits: one update's places.
wire::ProgressAnswer Update(DataLeases& leases, const wire::DataProgress& progress, absl::Time now) {
  auto admission = leases.Admit(progress, now);
  EXPECT_TRUE(admission.ok()) << admission.status();
  if (admission->apply()) admission->Commit();
  return admission->answer();
}

TEST(DataLeasesTest, ShardsGoOutInOrderAndANewEpochOpensWhenAllAreOut) {
  DataLeases leases("ps:0");
  const absl::Time now = absl::Now();
  std::vector<std::pair<int64_t, int64_t>> handed;  // (epoch, shard)
  for (int i = 0; i < 6; ++i) {
    auto lease = leases.Lease(Ask("worker:" + std::to_string(i)), now);
    ASSERT_TRUE(lease.ok()) << lease.status();
    ASSERT_NE(lease->lease(), 0);
    handed.emplace_back(lease->epoch(), lease->shard());
    EXPECT_EQ(lease->begin(), lease->shard() * 40);
    EXPECT_EQ(lease->end(), std::min<int64_t>(100, (lease->shard() + 1) * 40));
  }
  const std::vector<std::pair<int64_t, int64_t>> expected = {{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {1, 2}};
  EXPECT_EQ(handed, expected);
  // Two epochs open, every shard out: none free. The live workers are the
  // six holding leases, not the one that waits for a shard.
  auto none = leases.Lease(Ask("worker:9"), now);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->lease(), 0);
  EXPECT_EQ(none->live_workers(), 6);
}

TEST(DataLeasesTest, AShardIsAppliedOnceAndInOrder) {
  DataLeases leases("ps:1");  // a task that holds no lease table: the rule alone
  wire::LeaseResponse lease;
  lease.set_lease(1);
  lease.set_shard(1);
  const absl::Time now = absl::Now();
  wire::ProgressAnswer first = Update(leases, Places(lease, 40, 50), now);
  EXPECT_TRUE(first.applied());
  EXPECT_EQ(first.watermark(), 50);
  // The same places again (a repeat, or another worker resuming): not applied.
  wire::ProgressAnswer again = Update(leases, Places(lease, 40, 50), now);
  EXPECT_FALSE(again.applied());
  EXPECT_EQ(again.watermark(), 50);
  // A gap: not applied, and the answer says where the shard stands here.
  wire::ProgressAnswer gap = Update(leases, Places(lease, 60, 70), now);
  EXPECT_FALSE(gap.applied());
  EXPECT_EQ(gap.watermark(), 50);
  EXPECT_TRUE(Update(leases, Places(lease, 50, 60), now).applied());
  // A lease older than one this task has seen for the shard is refused.
  wire::LeaseResponse newer = lease;
  newer.set_lease(5);
  EXPECT_TRUE(Update(leases, Places(newer, 60, 70), now).applied());
  wire::ProgressAnswer superseded = Update(leases, Places(lease, 70, 80), now);
  EXPECT_TRUE(superseded.lease_lost());
  EXPECT_FALSE(superseded.applied());

  const wire::LedgerResponse ledger = leases.Ledger();
  ASSERT_EQ(ledger.epochs_size(), 1);
  EXPECT_EQ(ledger.epochs(0).repeated_places(), 0);
  ASSERT_EQ(ledger.epochs(0).bounds_size(), 2);
  EXPECT_EQ(ledger.epochs(0).bounds(0), 40);
  EXPECT_EQ(ledger.epochs(0).bounds(1), 70);
}

TEST(DataLeasesTest, AnExpiredLeaseResumesWhereEveryTaskHadAppliedAndItsOldHolderIsRefused) {
  DataLeases leases("ps:0");
  const absl::Time start = absl::Now();
  auto held = leases.Lease(Ask("worker:0"), start);
  ASSERT_TRUE(held.ok());
  EXPECT_TRUE(Update(leases, Places(*held, 0, 10), start).applied());
  // The next update begins at 10: every task had applied [0, 10).
  EXPECT_TRUE(Update(leases, Places(*held, 10, 20), start).applied());
  // worker:0 stalls past the timeout; worker:1 takes the shard over.
  const absl::Time later = start + absl::Seconds(2);
  auto taken = leases.Lease(Ask("worker:1"), later);
  ASSERT_TRUE(taken.ok());
  EXPECT_EQ(taken->shard(), 0);
  EXPECT_EQ(taken->epoch(), 0);
  EXPECT_EQ(taken->begin(), 10);  // the begin of the holder's last update
  EXPECT_GT(taken->lease(), held->lease());
  // The old holder wakes up: its commit for a shard it no longer holds is
  // refused and changes nothing.
  wire::ProgressAnswer stale = Update(leases, Places(*held, 20, 30), later);
  EXPECT_TRUE(stale.lease_lost());
  EXPECT_FALSE(stale.applied());
  // The new holder resumes at 10: [10, 20) is already applied here, [20, 30) is not.
  EXPECT_FALSE(Update(leases, Places(*taken, 10, 20), later).applied());
  EXPECT_TRUE(Update(leases, Places(*taken, 20, 30), later).applied());
  const wire::LedgerResponse ledger = leases.Ledger();
  ASSERT_EQ(ledger.epochs_size(), 1);
  EXPECT_EQ(ledger.epochs(0).repeated_places(), 0);
  EXPECT_EQ(ledger.epochs(0).bounds(1), 30);
}

// A sync step's wait sends no update: the holder renews its lease, which
// then outlives the timeout; only its holder can renew it, and a lease that
// ran out is not renewed. The live count is the holders of unexpired leases.
TEST(DataLeasesTest, AHolderWaitingForItsStepRenewsItsLease) {
  DataLeases leases("ps:0");
  const absl::Time start = absl::Now();
  auto held = leases.Lease(Ask("worker:0"), start);
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(leases.Lease(Ask("worker:1"), start).ok());
  auto renew = [&](const std::string& worker, int64_t lease, absl::Time now) {
    wire::LeaseRequest request = Ask(worker);
    request.set_return_lease(lease);
    request.set_renew(true);
    auto answer = leases.Lease(request, now);
    EXPECT_TRUE(answer.ok()) << answer.status();
    return *answer;
  };
  const wire::LeaseResponse renewed = renew("worker:0", held->lease(), start + absl::Milliseconds(800));
  EXPECT_EQ(renewed.lease(), held->lease());
  EXPECT_EQ(renewed.shard(), held->shard());
  EXPECT_EQ(renewed.live_workers(), 2);
  // Another worker naming the lease renews nothing.
  EXPECT_EQ(renew("worker:1", held->lease(), start + absl::Milliseconds(900)).lease(), 0);
  // At 1.5 s worker:1's lease (never renewed) has run out; worker:0's has not.
  const wire::LeaseResponse later = renew("worker:0", held->lease(), start + absl::Milliseconds(1500));
  EXPECT_EQ(later.lease(), held->lease());
  EXPECT_EQ(later.live_workers(), 1);
  EXPECT_TRUE(Update(leases, Places(*held, 0, 10), start + absl::Milliseconds(1600)).applied());
  // Past its timeout with no renewal, it is gone, and renewing it says so.
  EXPECT_EQ(renew("worker:0", held->lease(), start + absl::Seconds(4)).lease(), 0);
}

TEST(DataLeasesTest, AnEpochFinishesWhenEveryShardIsHandedBackFinished) {
  DataLeases leases("ps:0");
  const absl::Time now = absl::Now();
  int64_t lease_held = 0;
  for (int i = 0; i < 3; ++i) {
    wire::LeaseRequest ask = Ask("worker:0");
    ask.set_return_lease(lease_held);
    ask.set_finished(lease_held != 0);
    auto lease = leases.Lease(ask, now);
    ASSERT_TRUE(lease.ok());
    EXPECT_EQ(lease->epoch(), 0);
    EXPECT_EQ(lease->epochs_done(), 0);
    EXPECT_TRUE(Update(leases, Places(*lease, lease->begin(), lease->end()), now).applied());
    lease_held = lease->lease();
  }
  wire::LeaseRequest last = Ask("worker:0");
  last.set_return_lease(lease_held);
  last.set_finished(true);
  auto next = leases.Lease(last, now);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->epochs_done(), 1);
  EXPECT_EQ(next->epoch(), 1);
  const auto checks = CheckLedgers({leases.Ledger()}, 100, 1);
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_EQ(checks[0].applied_once, 100);
  EXPECT_EQ(checks[0].missing, 0);
  EXPECT_EQ(checks[0].repeated, 0);
}

// A lease request names the job's epochs: no shard of a later one goes
// out, and once those are finished the answer says the data is over.
TEST(DataLeasesTest, NoShardPastTheJobsEpochsGoesOut) {
  DataLeases leases("ps:0");
  const absl::Time now = absl::Now();
  auto ask = [](const std::string& worker, int64_t returned) {
    wire::LeaseRequest request = Ask(worker);
    request.set_epochs(1);
    request.set_return_lease(returned);
    request.set_finished(returned != 0);
    return request;
  };
  std::vector<wire::LeaseResponse> held;
  for (int i = 0; i < 3; ++i) held.push_back(leases.Lease(ask("worker:" + std::to_string(i), 0), now).value());
  auto none = leases.Lease(ask("worker:3", 0), now);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->lease(), 0);  // epoch 1 is not opened
  EXPECT_EQ(none->epochs_done(), 0);
  for (int i = 0; i < 3; ++i) {
    const wire::LeaseResponse& lease = held[i];
    EXPECT_EQ(lease.epoch(), 0);
    EXPECT_TRUE(Update(leases, Places(lease, lease.begin(), lease.end()), now).applied());
    auto after = leases.Lease(ask("worker:" + std::to_string(i), lease.lease()), now);
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(after->lease(), 0);
    EXPECT_EQ(after->epochs_done(), i == 2 ? 1 : 0);
  }
  // Every worker that asked is still in the job, lease or not, until it
  // leaves or a lease timeout (1 s) passes without a word from it: the
  // chief ends the job when none is left.
  wire::LeaseRequest leave = ask("worker:0", 0);
  leave.set_leaving(true);
  EXPECT_EQ(leases.Lease(leave, now).value().members(), 3);
  EXPECT_EQ(leases.Lease(leave, now + absl::Seconds(2)).value().members(), 0);
  wire::LeaseRequest bad = ask("worker:0", 0);
  bad.set_epochs(-1);
  EXPECT_TRUE(absl::IsInvalidArgument(leases.Lease(bad, now).status()));
}

TEST(DataLeasesTest, TheCheckFindsMissingAndRepeatedPlaces) {
  wire::LedgerResponse whole, holed, twice;
  auto add = [](wire::LedgerResponse& ledger, std::vector<int64_t> bounds, int64_t repeated) {
    wire::EpochLedger* epoch = ledger.add_epochs();
    for (int64_t b : bounds) epoch->add_bounds(b);
    epoch->set_repeated_places(repeated);
  };
  add(whole, {0, 100}, 0);
  add(holed, {0, 40, 50, 100}, 0);
  add(twice, {0, 100}, 10);
  auto checks = CheckLedgers({whole, holed}, 100, 1);
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_EQ(checks[0].missing, 10);
  checks = CheckLedgers({whole, twice}, 100, 1);
  EXPECT_EQ(checks[0].repeated, 10);
  EXPECT_EQ(checks[0].missing, 0);
  // An epoch not finished may stop anywhere, but not repeat.
  checks = CheckLedgers({holed}, 100, 0);
  EXPECT_EQ(checks[0].missing, 0);
  // Epochs 0 and 2 kept, 1 finished but kept by no ledger: all missing.
  wire::LedgerResponse gap;
  add(gap, {0, 100}, 0);
  gap.mutable_epochs(0)->set_epoch(0);
  add(gap, {0, 100}, 0);
  gap.mutable_epochs(1)->set_epoch(2);
  checks = CheckLedgers({gap}, 100, 3);
  ASSERT_EQ(checks.size(), 3u);
  EXPECT_EQ(checks[1].epoch, 1);
  EXPECT_EQ(checks[1].missing, 100);
  EXPECT_EQ(checks[0].missing + checks[2].missing, 0);
  // The ledger itself counts overlapping places as repeats.
  DataLeases leases("ps:1");
  wire::LeaseResponse lease;
  lease.set_lease(1);
  const absl::Time now = absl::Now();
  Update(leases, Places(lease, 0, 10), now);
  wire::DataProgress overlapping = Places(lease, 5, 15);
  auto admission = leases.Admit(overlapping, now);
  ASSERT_TRUE(admission.ok());
  EXPECT_FALSE(admission->apply());  // the rule already keeps it out
}

// Leased data is for the modes that lease it.
TEST(DataLeasesTest, AConfigThatCannotLeaseItsDataIsRefusedNamingWhy) {
  for (const char* mode : {"ssp", "population"}) {
    auto config = ParseJobConfig(absl::StrCat("data: {leases: true}\ntraining: {mode: ", mode, "}\n"));
    ASSERT_FALSE(config.ok()) << mode;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(config.status().message().find(
                  "works with training.mode async, sync, downpour, model_average and easgd, not " + std::string(mode)),
              std::string::npos)
        << config.status();
  }
  EXPECT_TRUE(ParseJobConfig("data: {leases: true}\ntraining: {mode: sync}\n").ok());
  EXPECT_TRUE(ParseJobConfig("data: {leases: true}\ntraining: {mode: easgd}\n").ok());
  auto bad_timeout = ParseJobConfig("data: {leases: true, lease_timeout_s: 0}\n");
  ASSERT_FALSE(bad_timeout.ok());
  EXPECT_NE(bad_timeout.status().message().find("data.lease_timeout_s"), std::string::npos) << bad_timeout.status();
}

TEST(DataLeasesTest, BadRequestsAreRefusedAndChangeNothing) {
  DataLeases leases("ps:0");
  const absl::Time now = absl::Now();
  ASSERT_TRUE(leases.Lease(Ask("worker:0"), now).ok());
  // Another job's data: refused, naming both.
  wire::LeaseRequest other = Ask("worker:1");
  other.set_data_fingerprint(kFingerprint + 1);
  auto refused = leases.Lease(other, now);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("fingerprint 78"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("fingerprint 77"), std::string::npos) << refused.status();
  // Nameless, or describing no data.
  EXPECT_EQ(leases.Lease(Ask(""), now).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(leases.Lease(Ask("worker:1", 0), now).status().code(), absl::StatusCode::kInvalidArgument);
  // Malformed places.
  wire::LeaseResponse lease;
  lease.set_lease(1);
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{10, 10}, {-5, 3}, {20, 10}}) {
    auto admission = leases.Admit(Places(lease, begin, end), now);
    EXPECT_EQ(admission.status().code(), absl::StatusCode::kInvalidArgument) << begin << " " << end;
  }
  // A commit for a lease nobody was given is refused.
  wire::LeaseResponse forged;
  forged.set_lease(99);
  EXPECT_TRUE(Update(leases, Places(forged, 0, 10), now).lease_lost());
  EXPECT_EQ(leases.Ledger().epochs_size(), 0);
  // A malformed table to restore is refused whole.
  wire::LeaseTableState bad = leases.Snapshot();
  bad.add_shard_offsets(5);
  EXPECT_EQ(leases.Restore(bad, true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(leases.Snapshot().shard_offsets_size(), 3);
}

TEST(DataLeasesTest, ATableRestoredFromACheckpointResumesItsShardsAndForgetsWhatLaterUpdatesApplied) {
  DataLeases leases("ps:0");
  const absl::Time now = absl::Now();
  auto lease = leases.Lease(Ask("worker:0"), now);
  ASSERT_TRUE(lease.ok());
  Update(leases, Places(*lease, 0, 10), now);
  Update(leases, Places(*lease, 10, 20), now);
  const wire::LeaseTableState saved = leases.Snapshot();
  ASSERT_EQ(saved.shard_offsets_size(), 3);
  EXPECT_EQ(saved.shard_offsets(0), 10);
  Update(leases, Places(*lease, 20, 30), now);
  ASSERT_TRUE(leases.Restore(saved, true).ok());
  // The old lease is gone; the shard resumes at 10 for whoever asks.
  EXPECT_TRUE(Update(leases, Places(*lease, 30, 40), now).lease_lost());
  auto resumed = leases.Lease(Ask("worker:1"), now);
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ(resumed->shard(), 0);
  EXPECT_EQ(resumed->begin(), 10);
  EXPECT_TRUE(Update(leases, Places(*resumed, 10, 20), now).applied());
  const wire::LedgerResponse ledger = leases.Ledger();
  ASSERT_EQ(ledger.epochs_size(), 1);
  EXPECT_EQ(ledger.epochs(0).repeated_places(), 0);
  EXPECT_EQ(ledger.epochs(0).bounds(1), 20);

  // Another ps task, started afresh, takes the watermarks and the ledger but
  // no table: it refuses no lease, and resumes each shard at its offset.
  DataLeases other("ps:1");
  ASSERT_TRUE(other.Restore(saved, /*hands_out_leases=*/false).ok());
  EXPECT_TRUE(other.Snapshot().shard_offsets().empty());
  EXPECT_FALSE(Update(other, Places(*resumed, 0, 10), now).applied());
  EXPECT_TRUE(Update(other, Places(*resumed, 10, 20), now).applied());
  const auto checks = CheckLedgers({other.Ledger()}, 100, 0);
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_EQ(checks[0].applied_once, 20);
  EXPECT_EQ(checks[0].repeated, 0);
}

// Through a server: variable "w" of `initial`, plain SGD at rate 1.
absl::Status CreateW(VariableService& service, const torch::Tensor& initial) {
  Request create;
  wire::VariableDef* def = create.header.mutable_create_variables()->add_variables();
  def->set_name("w");
  def->add_shape(initial.size(0));
  def->mutable_optimizer()->set_kind("sgd");
  def->mutable_optimizer()->set_learning_rate(1.0);
  create.tensors.push_back(initial);
  Response response;
  service.Handle(create, &response);
  if (response.header.status_code() == 0) return absl::OkStatus();
  return absl::InternalError(response.header.status_message());
}

// Through a server: the lease `worker` is handed (the task keeps the lease
// table from then on).
absl::StatusOr<wire::LeaseResponse> LeaseFrom(VariableService& service, const std::string& worker) {
  Request request;
  *request.header.mutable_lease() = Ask(worker);
  Response response;
  service.Handle(request, &response);
  if (response.header.status_code() != 0) return absl::InternalError(response.header.status_message());
  return response.header.lease();
}

// Through a server: an update for a lease its sender does not hold leaves
// the variable and the counters as they were.
TEST(DataLeasesTest, AServerAppliesNothingOfAnUpdateWhoseLeaseIsNotHeld) {
  VariableService service(VariableServiceOptions{"/job:ps/task:0"});
  ASSERT_TRUE(CreateW(service, torch::ones({2})).ok());
  const absl::StatusOr<wire::LeaseResponse> leased = LeaseFrom(service, "worker:0");
  ASSERT_TRUE(leased.ok()) << leased.status();
  const wire::LeaseResponse& lease = *leased;

  auto apply = [&](int64_t lease_number, int64_t begin, int64_t end) {
    Request request;
    auto* op = request.header.mutable_apply_gradients();
    op->add_names("w");
    wire::CounterDelta* counter = op->add_counters();
    counter->set_name("global_step");
    counter->set_delta(1);
    wire::LeaseResponse which = lease;
    which.set_lease(lease_number);
    *op->mutable_progress() = Places(which, begin, end);
    request.tensors.push_back(torch::ones({2}));
    Response answer;
    service.Handle(request, &answer);
    EXPECT_EQ(answer.header.status_code(), 0) << answer.header.status_message();
    return answer.header.apply_gradients();
  };
  auto value = [&] {
    Request read;
    read.header.mutable_read()->add_names("w");
    Response answer;
    service.Handle(read, &answer);
    return answer.tensors.at(0).clone();
  };
  const auto applied = apply(lease.lease(), 0, 10);
  EXPECT_TRUE(applied.progress().applied());
  EXPECT_EQ(applied.counter_values(0), 1);
  const torch::Tensor after_one = value();
  EXPECT_TRUE(torch::allclose(after_one, torch::zeros({2})));
  const auto forged = apply(lease.lease() + 7, 10, 20);
  EXPECT_TRUE(forged.progress().lease_lost());
  EXPECT_EQ(forged.counter_values(0), 1);  // global_step unmoved
  EXPECT_TRUE(torch::equal(value(), after_one));
  const auto repeated = apply(lease.lease(), 0, 10);
  EXPECT_FALSE(repeated.progress().applied());
  EXPECT_TRUE(torch::equal(value(), after_one));
}

// Through a server: a checkpoint's snapshot of a task is taken with no
// update admitted meanwhile, and the watermarks it reports are exactly the
// places its variables hold. "w" counts places: each update of n places
// sends the gradient -n at rate 1. Saves race a stream of updates; every
// saved shard's w must equal the places below its marks.
TEST(DataLeasesTest, ASnapshotAndItsMarksAreTakenTogetherWhileUpdatesStream) {
  const std::filesystem::path dir = FreshTempDir("shoal_leases", "marks");
  VariableServiceOptions options{"/job:ps/task:1"};
  options.checkpoint_dir = dir.string();
  VariableService service(options);
  ASSERT_TRUE(CreateW(service, torch::zeros({1})).ok());
  std::atomic<bool> stop{false};
  std::atomic<int64_t> applied{0};
  std::thread updates([&] {
    wire::LeaseResponse lease;
    lease.set_lease(1);
    for (int64_t epoch = 0; !stop; ++epoch) {
      lease.set_epoch(epoch);
      for (int64_t shard = 0; shard < 3 && !stop; ++shard) {
        lease.set_shard(shard);
        for (int64_t place = shard * 40; place < std::min<int64_t>(100, shard * 40 + 40) && !stop; place += 3) {
          const int64_t end = std::min<int64_t>({place + 3, shard * 40 + 40, 100});
          Request request;
          request.header.mutable_apply_gradients()->add_names("w");
          wire::CounterDelta* step = request.header.mutable_apply_gradients()->add_counters();
          step->set_name("global_step");
          step->set_delta(1);
          *request.header.mutable_apply_gradients()->mutable_progress() = Places(lease, place, end);
          request.tensors.push_back(torch::full({1}, -static_cast<float>(end - place)));
          Response response;
          service.Handle(request, &response);
          ASSERT_EQ(response.header.status_code(), 0) << response.header.status_message();
          applied += end - place;
        }
      }
    }
  });
  while (applied < 300) absl::SleepFor(absl::Milliseconds(1));
  int64_t last_held = 0;
  for (int step = 1; step <= 5; ++step) {
    Request save;
    save.header.mutable_save_shard()->set_step(step);
    save.header.mutable_save_shard()->set_shard(0);
    save.header.mutable_save_shard()->set_step_counter("global_step");
    Response response;
    service.Handle(save, &response);
    ASSERT_EQ(response.header.status_code(), 0) << response.header.status_message();
    const wire::TaskMarks& marks = response.header.save_shard().marks();
    EXPECT_TRUE(marks.exact());
    // Updates of 3 places (a shard's last one shorter): the step counter
    // counts those below the marks.
    int64_t below_marks = 0, updates = 0;
    for (const wire::ShardMark& mark : marks.variables()) {
      below_marks += mark.watermark() - mark.shard() * 40;
      updates += (mark.watermark() - mark.shard() * 40 + 2) / 3;
    }
    EXPECT_EQ(marks.step(), updates) << "save " << step;
    auto saved = ReadShard(response.header.save_shard().path());
    ASSERT_TRUE(saved.ok()) << saved.status();
    ASSERT_EQ(saved->size(), 1u);
    const int64_t held = static_cast<int64_t>((*saved)[0].value[0].item<float>());
    EXPECT_EQ(held, below_marks) << "save " << step;
    EXPECT_GE(held, last_held);
    last_held = held;
  }
  stop = true;
  updates.join();
  EXPECT_GT(last_held, 0);

  // A sync gradient committed into an accumulator is not in the variables
  // until its step applies: the marks say so.
  DataLeases leases("ps:1");
  wire::LeaseResponse lease;
  lease.set_lease(1);
  {
    auto admission = leases.Admit(Places(lease, 0, 10), absl::Now());
    ASSERT_TRUE(admission.ok());
    admission->CommitAccumulated();
  }
  bool exact = true;
  const std::vector<wire::ShardMark> marks = DataLeases::Frozen(leases).Marks(0, &exact);
  EXPECT_FALSE(exact);
  ASSERT_EQ(marks.size(), 1u);
  EXPECT_EQ(marks[0].watermark(), 10);
}

// A checkpoint's table and two tasks' marks, one update apart on shard 0
// (ps:0 at 20, ps:1 at 30), the table read before at 10.
CheckpointIndex IndexWithMarks(bool ps1_exact) {
  CheckpointIndex index;
  index.shards = {"shard-0.ckpt", "shard-1.ckpt"};
  index.tasks = {"/job:ps/task:0", "/job:ps/task:1"};
  index.variables.push_back({"w", {2}, {{0, "w", 0, 2}}});
  index.variables.push_back({"b", {2}, {{1, "b", 0, 2}}});
  wire::LeaseTableState table;
  table.set_data_fingerprint(kFingerprint);
  table.set_examples(100);
  table.set_shard_examples(40);
  table.set_epochs_done(0);
  for (int64_t offset : {10, 40, 80}) table.add_shard_offsets(offset);
  index.lease_table = table;
  auto mark = [](wire::TaskMarks& marks, int64_t epoch, int64_t shard, int64_t watermark) {
    wire::ShardMark* m = marks.add_variables();
    m->set_epoch(epoch);
    m->set_shard(shard);
    m->set_watermark(watermark);
  };
  wire::TaskMarks ps0, ps1;
  ps0.set_exact(true);
  ps0.set_step(7);  // the counter task's step count at its snapshot
  ps1.set_exact(ps1_exact);
  mark(ps0, 0, 0, 20);
  mark(ps1, 0, 0, 30);
  index.lease_marks = {ps0, ps1};
  return index;
}

std::vector<int64_t> Offsets(const wire::LeaseTableState& table) {
  return {table.shard_offsets().begin(), table.shard_offsets().end()};
}

TEST(DataLeasesTest, ARestoreResumesEachShardAtTheLeastMarkAndCutsItsBatchesAtTheOthers) {
  auto plan = PlanLeaseRestore(IndexWithMarks(true), /*same_tasks=*/true, "ckpt-5");
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Shard 0 resumes at 20 (not the table's 10: those places are in both
  // tasks' variables), cut at 30; shards 1 and 2 had not begun.
  EXPECT_EQ(Offsets(plan->table), (std::vector<int64_t>{20, 40, 80}));
  ASSERT_EQ(plan->table.cuts_size(), 1);
  EXPECT_EQ(plan->table.cuts(0).watermark(), 30);
  ASSERT_EQ(plan->by_task.size(), 2u);
  const wire::TaskMarks& ps1 = plan->by_task.at("/job:ps/task:1");
  ASSERT_EQ(ps1.variables_size(), 3);  // every open shard
  EXPECT_EQ(ps1.variables(0).watermark(), 30);
  EXPECT_EQ(ps1.variables(1).watermark(), 40);
  EXPECT_EQ(plan->step, 7);

  // Onto the tasks: the counter task hands the shard out from 20 with the
  // cut; the batch [20, 30) is applied on ps:0 only, then [30, 40) on both.
  DataLeases ps0_leases("ps:0"), ps1_leases("ps:1");
  const std::vector<wire::ShardMark> ps0_marks(plan->by_task.at("/job:ps/task:0").variables().begin(),
                                               plan->by_task.at("/job:ps/task:0").variables().end());
  const std::vector<wire::ShardMark> ps1_marks(ps1.variables().begin(), ps1.variables().end());
  ASSERT_TRUE(ps0_leases.Restore(plan->table, /*hands_out_leases=*/true, &ps0_marks).ok());
  ASSERT_TRUE(ps1_leases.Restore(plan->table, false, &ps1_marks).ok());
  const absl::Time now = absl::Now();
  auto lease = ps0_leases.Lease(Ask("worker:0"), now);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->begin(), 20);
  ASSERT_EQ(lease->cuts_size(), 1);
  EXPECT_EQ(lease->cuts(0), 30);
  EXPECT_TRUE(Update(ps0_leases, Places(*lease, 20, 30), now).applied());
  const wire::ProgressAnswer ahead = Update(ps1_leases, Places(*lease, 20, 30), now);
  EXPECT_FALSE(ahead.applied());
  EXPECT_EQ(ahead.watermark(), 30);
  EXPECT_TRUE(Update(ps0_leases, Places(*lease, 30, 40), now).applied());
  EXPECT_TRUE(Update(ps1_leases, Places(*lease, 30, 40), now).applied());
  for (DataLeases* task : {&ps0_leases, &ps1_leases}) {
    const auto checks = CheckLedgers({task->Ledger()}, 100, 0);
    ASSERT_EQ(checks.size(), 1u);
    EXPECT_EQ(checks[0].applied_once, 40);  // shard 0 whole, each place once
    EXPECT_EQ(checks[0].repeated, 0);
  }
}

TEST(DataLeasesTest, ARestorePlanFallsBackWhereMarksCannotSayWhatTheVariablesHold) {
  // A sync gradient in ps:1's accumulators: the table's offset stands for
  // the variables (a sync checkpoint holds one step), cut at ps:0's mark.
  auto sync = PlanLeaseRestore(IndexWithMarks(false), true, "ckpt-5");
  ASSERT_TRUE(sync.ok()) << sync.status();
  EXPECT_EQ(Offsets(sync->table), (std::vector<int64_t>{10, 40, 80}));
  ASSERT_EQ(sync->table.cuts_size(), 1);
  EXPECT_EQ(sync->table.cuts(0).watermark(), 20);
  EXPECT_FALSE(sync->by_task.at("/job:ps/task:1").exact());
  EXPECT_FALSE(sync->step.has_value());  // the checkpoint's own step stands

  // Onto other tasks: every task takes the least marks (ps:1 trains 10
  // places again).
  auto moved = PlanLeaseRestore(IndexWithMarks(true), /*same_tasks=*/false, "ckpt-5");
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_TRUE(moved->by_task.empty());
  ASSERT_TRUE(moved->every_task.has_value());
  EXPECT_EQ(moved->every_task->variables(0).watermark(), 20);

  // Marks in an epoch the table opened while the save ran: the restored
  // table holds it open too.
  CheckpointIndex later = IndexWithMarks(true);
  wire::ShardMark* next_epoch = later.lease_marks[0].add_variables();
  next_epoch->set_epoch(1);
  next_epoch->set_shard(0);
  next_epoch->set_watermark(5);
  auto extended = PlanLeaseRestore(later, true, "ckpt-5");
  ASSERT_TRUE(extended.ok()) << extended.status();
  EXPECT_EQ(Offsets(extended->table), (std::vector<int64_t>{20, 40, 80, 0, 40, 80}));

  // An older checkpoint, with no marks: the table as it was saved.
  CheckpointIndex older = IndexWithMarks(true);
  older.lease_marks.clear();
  auto old_plan = PlanLeaseRestore(older, true, "ckpt-5");
  ASSERT_TRUE(old_plan.ok());
  EXPECT_EQ(Offsets(old_plan->table), (std::vector<int64_t>{10, 40, 80}));
  EXPECT_TRUE(old_plan->by_task.empty());
  EXPECT_FALSE(old_plan->every_task.has_value());

  // A mark past its shard's places is a damaged checkpoint.
  CheckpointIndex bad = IndexWithMarks(true);
  bad.lease_marks[1].mutable_variables(0)->set_watermark(55);
  auto refused = PlanLeaseRestore(bad, true, "ckpt-5");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(refused.status().message().find("ckpt-5"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("place 55 of epoch 0, shard 0"), std::string::npos) << refused.status();
}

// Through a server: a table's rows on a task apply a batch's places once,
// on a watermark of their own beside the variables' (the rows' push follows
// the dense update, and a worker may die between the two), and a push of
// no rows still moves it. The ledger answers for each table.
TEST(DataLeasesTest, ATableShardAppliesEachBatchsRowsOnceOnAWatermarkOfItsOwn) {
  VariableService service(VariableServiceOptions{"/job:ps/task:1"});
  ASSERT_TRUE(CreateW(service, torch::zeros({2})).ok());
  Response response;
  Request tables;
  wire::TableDef* table = tables.header.mutable_create_tables()->add_tables();
  table->set_name("emb");
  table->set_rows(4);
  table->set_dim(2);
  table->set_num_shards(1);
  table->mutable_optimizer()->set_kind("sgd");
  table->mutable_optimizer()->set_learning_rate(1.0);
  service.Handle(tables, &response);
  ASSERT_EQ(response.header.status_code(), 0) << response.header.status_message();
  wire::LeaseResponse lease;
  lease.set_lease(1);

  auto push_rows = [&](int64_t begin, int64_t end, std::vector<int64_t> ids) {
    Request request;
    auto* op = request.header.mutable_push_rows();
    op->set_table("emb");
    *op->mutable_progress() = Places(lease, begin, end);
    request.tensors.push_back(torch::tensor(ids, torch::kInt64));
    request.tensors.push_back(torch::ones({static_cast<int64_t>(ids.size()), 2}));
    Response answer;
    service.Handle(request, &answer);
    EXPECT_EQ(answer.header.status_code(), 0) << answer.header.status_message();
    return answer.header.push_rows().progress();
  };
  auto row = [&](int64_t id) {
    Request pull;
    pull.header.mutable_pull_rows()->set_table("emb");
    pull.tensors.push_back(torch::tensor({id}, torch::kInt64));
    Response answer;
    service.Handle(pull, &answer);
    return answer.tensors.at(0)[0].clone();
  };
  const torch::Tensor initial = row(1);
  // The variables take places [0, 10) first, as a push does.
  Request apply;
  apply.header.mutable_apply_gradients()->add_names("w");
  *apply.header.mutable_apply_gradients()->mutable_progress() = Places(lease, 0, 10);
  apply.tensors.push_back(torch::ones({2}));
  service.Handle(apply, &response);
  ASSERT_EQ(response.header.status_code(), 0) << response.header.status_message();
  EXPECT_TRUE(response.header.apply_gradients().progress().applied());

  const wire::ProgressAnswer first = push_rows(0, 10, {1});  // the same places, the rows' own watermark
  EXPECT_TRUE(first.applied());
  EXPECT_EQ(first.watermark(), 10);
  EXPECT_TRUE(torch::allclose(row(1), initial - 1));
  const wire::ProgressAnswer again = push_rows(0, 10, {1});
  EXPECT_FALSE(again.applied());
  EXPECT_TRUE(torch::allclose(row(1), initial - 1));  // unmoved
  const wire::ProgressAnswer ahead = push_rows(20, 30, {1});  // a gap
  EXPECT_FALSE(ahead.applied());
  EXPECT_EQ(ahead.watermark(), 10);
  EXPECT_TRUE(push_rows(10, 20, {}).applied());  // no rows: the watermark moves all the same
  EXPECT_TRUE(push_rows(20, 30, {1}).applied());
  EXPECT_TRUE(torch::allclose(row(1), initial - 2));

  Request ledger;
  ledger.header.mutable_ledger();
  service.Handle(ledger, &response);
  ASSERT_EQ(response.header.status_code(), 0) << response.header.status_message();
  const wire::LedgerResponse& ledgers = response.header.ledger();
  ASSERT_EQ(ledgers.epochs_size(), 1);
  EXPECT_EQ(std::vector<int64_t>(ledgers.epochs(0).bounds().begin(), ledgers.epochs(0).bounds().end()),
            (std::vector<int64_t>{0, 10}));
  ASSERT_EQ(ledgers.tables_size(), 1);
  EXPECT_EQ(ledgers.tables(0).table(), "emb");
  ASSERT_EQ(ledgers.tables(0).epochs_size(), 1);
  EXPECT_EQ(std::vector<int64_t>(ledgers.tables(0).epochs(0).bounds().begin(),
                                 ledgers.tables(0).epochs(0).bounds().end()),
            (std::vector<int64_t>{0, 30}));
  EXPECT_EQ(ledgers.tables(0).epochs(0).repeated_places(), 0);
}

// Through a server: an elastic move (easgd) that a task does not take still
// answers with the centre, unmoved, for the worker to start again from.
TEST(DataLeasesTest, AnElasticMoveNotTakenAnswersWithTheCentreUnmoved) {
  VariableService service(VariableServiceOptions{"/job:ps/task:0"});
  ASSERT_TRUE(CreateW(service, torch::ones({2})).ok());
  const absl::StatusOr<wire::LeaseResponse> leased = LeaseFrom(service, "worker:0");
  ASSERT_TRUE(leased.ok()) << leased.status();
  const wire::LeaseResponse& lease = *leased;

  // Moves the centre half way towards a copy of 3s; the answer and the centre after.
  auto move = [&](int64_t lease_number, int64_t begin, int64_t end) {
    Request request;
    auto* op = request.header.mutable_apply_gradients();
    op->add_names("w");
    op->set_rule(wire::UPDATE_ELASTIC);
    op->set_elastic_alpha(0.5);
    wire::LeaseResponse which = lease;
    which.set_lease(lease_number);
    *op->mutable_progress() = Places(which, begin, end);
    request.tensors.push_back(torch::full({2}, 3.0f));
    Response answer;
    service.Handle(request, &answer);
    EXPECT_EQ(answer.header.status_code(), 0) << answer.header.status_message();
    EXPECT_EQ(answer.tensors.size(), 1u);
    Request read;
    read.header.mutable_read()->add_names("w");
    Response now;
    service.Handle(read, &now);
    return std::tuple{answer.header.apply_gradients().progress(), answer.tensors.at(0).clone(), now.tensors.at(0)};
  };
  const auto [taken, before, after] = move(lease.lease(), 0, 10);
  EXPECT_TRUE(taken.applied());
  EXPECT_TRUE(torch::equal(before, torch::ones({2})));  // the centre before the move
  EXPECT_TRUE(torch::equal(after, torch::full({2}, 2.0f)));
  const auto [forged, forged_answer, after_forged] = move(lease.lease() + 7, 10, 20);
  EXPECT_TRUE(forged.lease_lost());
  EXPECT_TRUE(torch::equal(forged_answer, torch::full({2}, 2.0f)));  // the centre as it is
  EXPECT_TRUE(torch::equal(after_forged, torch::full({2}, 2.0f)));   // unmoved
  const auto [repeated, repeated_answer, after_repeat] = move(lease.lease(), 0, 10);
  EXPECT_FALSE(repeated.applied());
  EXPECT_TRUE(torch::equal(repeated_answer, torch::full({2}, 2.0f)));
  EXPECT_TRUE(torch::equal(after_repeat, torch::full({2}, 2.0f)));
}

// Through a server: a synchronous update (a sync gradient, a model_average
// copy) whose places the task applied already, from another worker's
// update, counts toward its step without adding its tensors. Were it not
// counted, a step on this task would wait for a worker that the other
// tasks counted and this one never will.
TEST(DataLeasesTest, AnAccumulateOfPlacesAppliedAlreadyCountsTowardItsStepAndAddsNothing) {
  VariableService service(VariableServiceOptions{"/job:ps/task:1"});  // holds no lease table
  ASSERT_TRUE(CreateW(service, torch::zeros({2})).ok());
  Response response;
  wire::LeaseResponse lease;
  lease.set_lease(1);
  auto accumulate = [&](const std::string& worker, float value) {
    Request request;
    auto* op = request.header.mutable_accumulate();
    op->add_names("w");
    op->set_local_step(0);
    op->set_worker(worker);
    *op->mutable_progress() = Places(lease, 0, 10);
    request.tensors.push_back(torch::full({2}, value));
    Response answer;
    service.Handle(request, &answer);
    EXPECT_EQ(answer.header.status_code(), 0) << answer.header.status_message();
    return answer.header.accumulate();
  };
  const auto first = accumulate("worker:0", 2);
  EXPECT_TRUE(first.progress().applied());
  EXPECT_TRUE(first.accepted(0));
  const auto again = accumulate("worker:1", 6);  // the same places
  EXPECT_FALSE(again.progress().applied());
  EXPECT_TRUE(again.accepted(0));  // counted

  Request average;
  auto* op = average.header.mutable_apply_accumulated();
  op->add_names("w");
  op->set_replicas_to_aggregate(2);
  op->set_new_step(1);
  op->set_rule(wire::ASSIGN_MEAN);
  service.Handle(average, &response);
  ASSERT_EQ(response.header.status_code(), 0) << response.header.status_message();
  EXPECT_TRUE(response.header.apply_accumulated().applied());  // two workers counted
  Request read;
  read.header.mutable_read()->add_names("w");
  service.Handle(read, &response);
  EXPECT_TRUE(torch::equal(response.tensors.at(0), torch::full({2}, 2.0f)));  // worker:1's 6 added nothing
}

// Whole jobs: every place of every finished epoch applied exactly once on
// every ps task.
JobConfig LeasedJob(const std::string& mode, int workers, int ps) {
  JobConfig config = QuickJob(mode);
  config.cluster.workers = workers;
  config.cluster.ps = ps;
  config.data.leases = true;
  config.data.train_examples = 3000;
  config.data.lease_shard_examples = 500;
  config.training.batch_size = 100;
  config.training.epochs = 4;  // the job ends when the lease table has finished them
  return config;
}

// Every place of `epochs` epochs applied exactly once on every ps task.
// `first_epoch`: a job resumed from a checkpoint keeps ledgers from the
// checkpoint's open epochs on (the earlier ones were checked by the job
// that trained them), and from the places its tasks had applied there.
void ExpectExactlyOnce(const TrainReport& report, int64_t epochs, int64_t first_epoch = 0) {
  const DataLedgerReport& ledger = report.data_ledger;
  EXPECT_TRUE(ledger.leased);
  EXPECT_EQ(ledger.epochs_finished, epochs);
  EXPECT_EQ(ledger.places_missing, 0);
  EXPECT_EQ(ledger.places_repeated, 0);
  if (first_epoch == 0) {
    EXPECT_EQ(ledger.places_applied, epochs * 3000);
  } else {
    EXPECT_GE(ledger.places_applied, (epochs - first_epoch - 1) * 3000);
    EXPECT_LE(ledger.places_applied, (epochs - first_epoch) * 3000);
  }
}

TEST(LeasedTrainingTest, AsyncWorkersTrainEveryExampleOnceOnEveryPsTask) {
  auto report = TrainInProcess(LeasedJob("async", 3, 2), InProcOptions{}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectExactlyOnce(*report, 4);
  EXPECT_GT(report->test_accuracy, 0.6);
}

TEST(LeasedTrainingTest, SyncWithABackupWorkerReturnsDroppedGradientsExamplesToBeTrainedAgain) {
  JobConfig config = LeasedJob("sync", 3, 2);
  config.training.replicas_to_aggregate = 2;  // one backup: its late gradient is dropped
  auto report = TrainInProcess(config, InProcOptions{}, nullptr, [](WorkerContext& context) {
    if (context.worker_index == 2) context.before_step = [](int64_t) { absl::SleepFor(absl::Milliseconds(3)); };
  });
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_GT(report->stale_gradients_dropped, 0);
  ExpectExactlyOnce(*report, 4);
}

TEST(LeasedTrainingTest, AWorkerThatStallsPastItsLeaseLosesTheShardAndNothingIsTrainedTwice) {
  JobConfig config = LeasedJob("async", 2, 2);
  config.data.lease_timeout_s = 0.3;
  // Worker 1 stalls now and then, past the lease timeout.
  Stalls stalls{/*worker=*/1, /*every=*/15, /*at=*/7, /*most=*/4, absl::Milliseconds(700)};
  auto report = TrainInProcess(config, InProcOptions{}, nullptr, stalls.Customizer());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_GT(stalls.count.load(), 0);
  EXPECT_GT(report->data_ledger.takeovers, 0);  // the stalled worker's shards went to the other
  ExpectExactlyOnce(*report, 4);
}

// A sync step takes the gradients of the workers live then, so how many
// steps a job's data makes depends on who trained: the job ends when the
// lease table has finished its epochs, not at a step count. Worker 1 starts
// training 1.5 s late; until then each step takes worker 0's gradient
// alone, and the job makes more steps than two gradients a step would.
TEST(LeasedTrainingTest, ASyncJobTrainsAllItsEpochsWhicheverWorkersWereLiveForItsSteps) {
  JobConfig config = LeasedJob("sync", 2, 2);
  Stalls late{/*worker=*/1, /*every=*/1, /*at=*/0, /*most=*/1, absl::Milliseconds(1500)};
  auto report = TrainInProcess(config, InProcOptions{}, nullptr, late.Customizer());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(late.count.load(), 1);
  ExpectExactlyOnce(*report, 4);
  EXPECT_GT(report->global_step, MaxSteps(config, 3000, 2));
}

// A slow worker's shard outlasts three lease timeouts (its updates renew
// it): the worker waiting for the open epochs' last shard waits as long as
// that, and does not fail for lack of a free shard.
TEST(LeasedTrainingTest, AWorkerWaitsForAShardAsLongAsAnotherHoldsOne) {
  JobConfig config = LeasedJob("async", 2, 1);
  config.data.lease_shard_examples = 1500;  // 15 batches: 3 s on the slow worker
  config.data.lease_timeout_s = 0.5;
  auto report = TrainInProcess(config, InProcOptions{}, nullptr, [](WorkerContext& context) {
    // Slow from its second step: its first lease is taken as the job starts.
    if (context.worker_index != 1) return;
    context.before_step = [](int64_t step) {
      if (step > 0) absl::SleepFor(absl::Milliseconds(200));
    };
  });
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectExactlyOnce(*report, 4);
}

// The local-replica modes: an exchange carries the places of its local
// steps (one range of one shard; an exchange comes early when its shard
// ends), so every place of an epoch is in exactly one averaged copy
// (model_average), one applied push of summed gradients (downpour) or one
// elastic move every task took (easgd).
JobConfig LeasedLocalJob(const std::string& mode) {
  JobConfig config = LeasedJob(mode, 3, 2);
  // 5-batch shards: exchanges after 3 local steps, then after 2.
  config.local.interval_steps = 3;
  config.local.n_push = 3;
  config.local.n_fetch = 3;
  config.local.tau = 3;
  return config;
}

constexpr const char* kLocalReplicaModes[] = {"model_average", "downpour", "easgd"};

TEST(LeasedTrainingTest, LocalReplicaModesExchangeEachPlaceExactlyOnce) {
  for (const char* mode : kLocalReplicaModes) {
    SCOPED_TRACE(mode);
    auto report = TrainInProcess(LeasedLocalJob(mode), InProcOptions{}, nullptr);
    ASSERT_TRUE(report.ok()) << report.status();
    ExpectExactlyOnce(*report, 4);
    EXPECT_GT(report->test_accuracy, 0.6);
  }
}

// A worker that stalls between exchanges past its lease: the others train
// on without it (model_average averages its rounds without it), its shard
// goes to another, and its exchange, sent late under the lost lease, is
// refused with its places.
TEST(LeasedTrainingTest, ALocalReplicaStalledPastItsLeaseHasItsLateExchangeRefused) {
  for (const char* mode : kLocalReplicaModes) {
    SCOPED_TRACE(mode);
    JobConfig config = LeasedLocalJob(mode);
    config.data.lease_timeout_s = 0.3;
    // Worker 2 stalls between exchanges.
    Stalls stalls{/*worker=*/2, /*every=*/7, /*at=*/4, /*most=*/3, absl::Milliseconds(900)};
    auto report = TrainInProcess(config, InProcOptions{}, nullptr, stalls.Customizer());
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_GT(stalls.count.load(), 0);
    EXPECT_GT(report->data_ledger.takeovers, 0);
    ASSERT_NE(stalls.leased, nullptr);
    EXPECT_GT(stalls.leased->leases_lost(), 0);  // a late exchange was refused
    ExpectExactlyOnce(*report, 4);
  }
}

// An async job on leased data with checkpoints under a fresh folder
// `name`, trained to step 70 (7,000 places: mid-epoch 2) into `first`; the
// config is left for the job resumed from it.
JobConfig TrainToACheckpoint(const std::string& name, absl::StatusOr<TrainReport>* first) {
  JobConfig config = LeasedJob("async", 2, 2);
  config.checkpoint.dir = (FreshTempDir("shoal_leases", name) / "ckpt").string();
  config.training.max_steps = 70;
  *first = TrainInProcess(config, InProcOptions{}, nullptr);
  config.training.max_steps = 0;
  return config;
}

TEST(LeasedTrainingTest, ACheckpointKeepsTheLeaseTableAndAJobResumedFromItTrainsEveryExampleOnce) {
  absl::StatusOr<TrainReport> first;
  JobConfig config = TrainToACheckpoint("resume", &first);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_FALSE(first->last_checkpoint.empty());
  auto index = ReadCheckpointIndex(first->last_checkpoint);
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_TRUE(index->lease_table.has_value());
  EXPECT_EQ(index->lease_table->examples(), 3000);
  EXPECT_GE(index->lease_table->epochs_done(), 1);

  // The job goes on from the checkpoint to 4 epochs' steps: the lease table
  // comes back on every ps task, and the ledgers, checked over both
  // sessions' epochs, hold every place once.
  auto resumed = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->restored_from, first->last_checkpoint);
  ExpectExactlyOnce(*resumed, 4, index->lease_table->epochs_done());

  // Other data: the checkpoint's table cannot say which of these examples
  // were trained.
  config.data.train_examples = 2900;
  auto other = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kDataLoss) << other.status();
  EXPECT_NE(other.status().message().find("2900 examples"), std::string::npos) << other.status();
  EXPECT_NE(other.status().message().find("3000 examples"), std::string::npos) << other.status();
}

// A restore whose tasks stood at different places of a shard, not a batch
// apart: ps:1's saved watermark of a shard in progress is moved 30 places
// on in the checkpoint's index (as if its snapshot had been taken after an
// update that ps:0's missed). The resumed job's batches end at that cut:
// ps:0 applies [w, w + 30) alone, then both go on from w + 30, and both
// ledgers hold every place once. Without the cut each place would still
// be applied once on each task, but 100-example batches from w would be
// applied by one task only, in turn, to the shard's end: a step in two
// wasted, and global_step (counted on ps:0) behind the workers' steps.
TEST(LeasedTrainingTest, ARestoreWhoseTasksStandApartEndsABatchAtTheCutAndTrainsEveryExampleOnce) {
  absl::StatusOr<TrainReport> first;
  JobConfig config = TrainToACheckpoint("cuts", &first);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::filesystem::path index_file = std::filesystem::path(first->last_checkpoint) / "index.json";
  nlohmann::json index;
  std::ifstream(index_file) >> index;
  const int64_t epochs_done = index["lease_table"]["epochs_done"].get<int64_t>();
  // Each task's marks, by its name.
  auto marks_of = [&](const std::string& task) -> nlohmann::json& {
    const auto& tasks = index["tasks"];
    const auto at = std::find(tasks.begin(), tasks.end(), task);
    EXPECT_NE(at, tasks.end()) << task;
    return index["lease_table"]["shard_marks"][at - tasks.begin()];
  };
  bool moved = false;
  for (auto& mark : marks_of("/job:ps/task:1")["variables"]) {
    const int64_t epoch = mark[0].get<int64_t>(), shard = mark[1].get<int64_t>(), place = mark[2].get<int64_t>();
    if (epoch != epochs_done || place + 30 >= (shard + 1) * 500) continue;
    mark[2] = place + 30;
    moved = true;
    break;
  }
  ASSERT_TRUE(moved) << index["lease_table"].dump();
  std::ofstream(index_file) << index.dump(1);
  const int64_t restored_step = marks_of("/job:ps/task:0")["step"].get<int64_t>();

  auto resumed = TrainInProcess(config, InProcOptions{}, nullptr);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->restored_from, first->last_checkpoint);
  ExpectExactlyOnce(*resumed, 4, epochs_done);
  EXPECT_EQ(resumed->worker_steps, resumed->global_step - restored_step);  // every step applied on ps:0
}

}  // namespace
}  // namespace shoal
