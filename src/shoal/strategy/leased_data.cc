#include "shoal/strategy/leased_data.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "shoal/core/status.h"
#include "shoal/server/data_leases.h"

namespace shoal {

int64_t LeaseShardExamples(int64_t configured, int64_t examples, int64_t batch_size) {
  if (configured > 0) return configured;
  const int64_t batches = std::clamp<int64_t>(examples / std::max<int64_t>(1, batch_size * 16), 1, 32);
  return batches * batch_size;
}

absl::StatusOr<DataLedgerReport> CheckJobLedgers(Client& client, int64_t examples) {
  SHOAL_ASSIGN_OR_RETURN(const wire::LeaseTableState table, client.LeaseTable());
  SHOAL_ASSIGN_OR_RETURN(const std::vector<wire::LedgerResponse> ledgers, client.Ledgers());
  DataLedgerReport report;
  for (const wire::LedgerResponse& ledger : ledgers) ++(ledger.tables().empty() ? report.variable_ledgers
                                                                                  : report.table_ledgers);
  report.leased = true;
  report.epochs_finished = table.epochs_done();
  for (const EpochCheck& epoch : CheckLedgers(ledgers, examples, table.epochs_done())) {
    ++report.epochs_checked;
    report.places_applied += epoch.applied_once;
    report.places_missing += epoch.missing;
    report.places_repeated += epoch.repeated;
  }
  SHOAL_ASSIGN_OR_RETURN(const std::vector<int64_t> counted,
                         client.AddToCounters({{kLeaseTakeoversCounter, 0},
                                               {kLeaseTakeoverMsCounter, 0},
                                               {kLeaseLongestTakeoverMsCounter, 0},
                                               {kJoinsCounter, 0},
                                               {kJoinMsCounter, 0}}));
  report.takeovers = counted[0];
  if (counted[0] > 0) report.takeover_seconds_mean = counted[1] / 1e3 / counted[0];
  report.takeover_seconds_max = counted[2] / 1e3;
  report.joins = counted[3];
  if (counted[3] > 0) report.join_seconds_mean = counted[4] / 1e3 / counted[3];
  return report;
}

LeasedData::LeasedData(Client& client, Dataset data, Options options)
    : client_(client), data_(std::move(data)), options_(std::move(options)) {}

wire::LeaseRequest LeasedData::Ask() const {
  wire::LeaseRequest request;
  request.set_worker(options_.worker);
  request.set_data_fingerprint(options_.data_fingerprint);
  request.set_examples(data_.size());
  request.set_shard_examples(options_.shard_examples);
  request.set_epochs(options_.epochs);
  return request;
}

absl::StatusOr<bool> LeasedData::TakeLease(bool finished) {
  wire::LeaseRequest request = Ask();
  request.set_timeout_ms(absl::ToInt64Milliseconds(options_.lease_timeout));
  request.set_return_lease(lease_.lease());
  request.set_finished(finished);
  SHOAL_ASSIGN_OR_RETURN(wire::LeaseResponse response, client_.Lease(request));
  live_workers_ = response.live_workers();
  lease_ = std::move(response);
  if (lease_.lease() == 0) return false;
  renewed_ = absl::Now();
  ++leases_taken_;
  cursor_ = sent_to_ = lease_.begin();
  return true;
}

const torch::Tensor& LeasedData::OrderOf(int64_t epoch) {
  auto found = orders_.find(epoch);
  if (found != orders_.end()) return found->second;
  while (orders_.size() >= 2) orders_.erase(orders_.begin());
  return orders_.emplace(epoch, EpochOrder(data_.size(), options_.seed, epoch)).first->second;
}

absl::StatusOr<bool> LeasedData::Next(torch::Tensor* images, torch::Tensor* labels,
                                      const std::function<absl::StatusOr<bool>()>& job_over) {
  absl::Time give_up = absl::Now() + 3 * options_.lease_timeout;
  // A shard is used up when every task applied it to its end (a lease may
  // also resume there: its last holder died before handing it back).
  while (lease_.lease() == 0 || cursor_ >= lease_.end()) {
    if (sent_to_ < cursor_) {
      // A shard's last places were kept local and never sent: handing it
      // back finished would lose them.
      return absl::InternalError(absl::StrCat(options_.worker, " trained places ", sent_to_, " to ", cursor_,
                                              " of shard ", lease_.shard(), " locally without sending an update"));
    }
    const bool finished = lease_.lease() != 0;
    SHOAL_ASSIGN_OR_RETURN(bool taken, TakeLease(finished));
    if (taken) continue;
    if (options_.epochs > 0 && lease_.epochs_done() >= options_.epochs) return false;  // the data is over
    SHOAL_ASSIGN_OR_RETURN(bool over, job_over());
    if (over) return false;
    // While others hold leases the wait ends: they finish their shards (a
    // slow model's may take long), or their leases run out.
    if (live_workers_ > 0) give_up = absl::Now() + 3 * options_.lease_timeout;
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          options_.worker, " found no shard of the data free to lease for ",
          absl::FormatDuration(3 * options_.lease_timeout), ", and no worker holds one"));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  int64_t until = lease_.end();
  for (int64_t cut : lease_.cuts()) {
    if (cut > cursor_) until = std::min(until, cut);
  }
  const int64_t count = std::min(options_.batch_size, until - cursor_);
  const torch::Tensor picked = OrderOf(lease_.epoch()).narrow(0, cursor_, count);
  *images = data_.images.index_select(0, picked);
  *labels = data_.labels.index_select(0, picked);
  progress_.set_lease(lease_.lease());
  progress_.set_epoch(lease_.epoch());
  progress_.set_shard(lease_.shard());
  progress_.set_shard_begin(lease_.shard() * options_.shard_examples);
  progress_.set_begin(sent_to_);
  progress_.set_end(cursor_ + count);
  batch_progress_ = progress_;
  batch_progress_.set_begin(cursor_);
  return true;
}

bool LeasedData::UpdateMustGo() const {
  if (progress_.end() >= lease_.end()) return true;
  return std::find(lease_.cuts().begin(), lease_.cuts().end(), progress_.end()) != lease_.cuts().end();
}

void LeasedData::Settle(const wire::ProgressAnswer& answer) {
  if (answer.lease_lost()) {
    // Another worker holds the shard now; it resumes from the counter task's
    // record. Places kept local under the lease go with it.
    lease_.Clear();
    cursor_ = sent_to_;
    ++leases_lost_;
    return;
  }
  if (answer.live_workers() > 0) live_workers_ = answer.live_workers();
  if (answer.applied()) renewed_ = absl::Now();
  cursor_ = sent_to_ = answer.watermark();
}

absl::Status LeasedData::RenewIfDue() {
  if (lease_.lease() == 0 || absl::Now() - renewed_ < options_.lease_timeout / 4) return absl::OkStatus();
  return AskLiveWorkers().status();
}

absl::StatusOr<int64_t> LeasedData::AskLiveWorkers() {
  wire::LeaseRequest request = Ask();
  request.set_return_lease(lease_.lease());
  request.set_renew(true);
  SHOAL_ASSIGN_OR_RETURN(const wire::LeaseResponse response, client_.Lease(request));
  live_workers_ = response.live_workers();
  renewed_ = absl::Now();
  // With places kept local the update still goes out under the lost lease,
  // and the tasks' answer (lease_lost) drops it: its places were not sent.
  if (lease_.lease() != 0 && response.lease() == 0 && sent_to_ == cursor_) {
    lease_.Clear();
    ++leases_lost_;
  }
  return live_workers_;
}

absl::StatusOr<int64_t> LeasedData::Leave() {
  wire::LeaseRequest request = Ask();
  request.set_return_lease(lease_.lease());
  // Places kept local but never sent are not trained: the shard resumes before them.
  request.set_finished(lease_.lease() != 0 && sent_to_ >= lease_.end());
  request.set_leaving(true);
  SHOAL_ASSIGN_OR_RETURN(wire::LeaseResponse response, client_.Lease(request));
  live_workers_ = response.live_workers();
  lease_.Clear();
  return response.members();
}

}  // namespace shoal
