#include "shoal/server/data_leases.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"

namespace shoal {

namespace {

// Places per epoch, and per update, that a request may name: bounds on what
// a request can make a task record.
constexpr int64_t kMaxExamples = int64_t{1} << 40;
constexpr int64_t kMaxEpoch = int64_t{1} << 40;

}  // namespace

absl::Status DataLeases::CheckLayout(const wire::LeaseRequest& request) const {
  if (request.examples() <= 0 || request.examples() > kMaxExamples || request.shard_examples() <= 0 ||
      request.data_fingerprint() == 0 || request.epochs() < 0 || request.epochs() > kMaxEpoch) {
    return absl::InvalidArgumentError(absl::StrCat("lease request from '", request.worker(), "' to ", task_name_,
                                                   ": examples ", request.examples(), ", shard_examples ",
                                                   request.shard_examples(), ", fingerprint ",
                                                   request.data_fingerprint(), ", epochs ", request.epochs(),
                                                   " do not describe a training set"));
  }
  const int64_t shards = (request.examples() + request.shard_examples() - 1) / request.shard_examples();
  if (shards > static_cast<int64_t>(kMaxTrackedShards) / 4) {
    return absl::InvalidArgumentError(absl::StrCat("lease request from '", request.worker(), "' to ", task_name_,
                                                   ": ", shards, " shards an epoch; at most ", kMaxTrackedShards / 4,
                                                   " (raise data.shard_examples)"));
  }
  if (has_table_ && (request.data_fingerprint() != layout_.fingerprint || request.examples() != layout_.examples ||
                     request.shard_examples() != layout_.shard_examples)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "lease request from '", request.worker(), "' to ", task_name_, " is for other data (fingerprint ",
        request.data_fingerprint(), ", ", request.examples(), " examples in shards of ", request.shard_examples(),
        ") than this job's lease table (fingerprint ", layout_.fingerprint, ", ", layout_.examples,
        " examples in shards of ", layout_.shard_examples, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<wire::LeaseResponse> DataLeases::Lease(const wire::LeaseRequest& request, absl::Time now) {
  std::lock_guard<std::mutex> lock(table_mu_);
  if (request.worker().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("lease request to ", task_name_, " names no worker"));
  }
  if (absl::Status layout = CheckLayout(request); !layout.ok()) return layout;
  if (!has_table_) {
    has_table_ = true;
    layout_ = Layout{request.data_fingerprint(), request.examples(), request.shard_examples()};
  }
  if (request.timeout_ms() > 0) timeout_ = absl::Milliseconds(std::min<int64_t>(request.timeout_ms(), 3'600'000));
  ExpireLeases(now);
  if (request.leaving()) {
    members_.erase(request.worker());
  } else if (members_.size() < kMaxTrackedShards || members_.count(request.worker()) != 0) {
    members_[request.worker()] = now + timeout_;
  }
  if (request.renew()) return Renew(request, now);
  if (request.return_lease() != 0) ReturnLease(request.return_lease(), request.finished());
  wire::LeaseResponse response;
  if (!request.leaving()) {
    int64_t epoch = 0, shard = 0;
    if (TableShard* free = NextFreeShard(request.epochs(), &epoch, &shard); free != nullptr) {
      if (free->lost_at != absl::InfinitePast()) {
        const absl::Duration waited = now - free->lost_at;
        ++takeovers_.count;
        takeovers_.total += waited;
        takeovers_.longest = std::max(takeovers_.longest, waited);
        free->lost_at = absl::InfinitePast();
      }
      free->state = ShardState::kLeased;
      free->lease = ++last_lease_;
      free->holder = request.worker();
      ++holders_[free->holder];
      free->deadline = now + timeout_;
      response.set_epoch(epoch);
      Describe(*free, shard, &response);
    }
  }
  response.set_live_workers(static_cast<int64_t>(holders_.size()));
  response.set_epochs_done(epochs_done_);
  response.set_members(Members());
  return response;
}

int64_t DataLeases::Members() const {
  int64_t members = static_cast<int64_t>(members_.size());
  for (const auto& [holder, leases] : holders_) members += members_.count(holder) == 0;
  return members;
}

void DataLeases::ExpireLeases(absl::Time now) {
  for (auto it = members_.begin(); it != members_.end();) {
    it = it->second < now ? members_.erase(it) : std::next(it);
  }
  for (auto& [epoch, shards] : open_epochs_) {
    for (TableShard& shard : shards) {
      if (shard.state == ShardState::kLeased && shard.deadline < now) {
        shard.lost_at = shard.deadline - timeout_;
        shard.state = ShardState::kQueued;
        Release(shard);
      }
    }
  }
}

void DataLeases::Release(TableShard& shard) {
  auto held = holders_.find(shard.holder);
  if (held != holders_.end() && --held->second == 0) holders_.erase(held);
  shard.lease = 0;
  shard.holder.clear();
}

wire::LeaseResponse DataLeases::Renew(const wire::LeaseRequest& request, absl::Time now) {
  wire::LeaseResponse response;
  for (auto& [epoch, shards] : open_epochs_) {
    for (size_t s = 0; s < shards.size(); ++s) {
      TableShard& shard = shards[s];
      if (shard.state != ShardState::kLeased || shard.lease != request.return_lease() ||
          shard.holder != request.worker()) {
        continue;
      }
      shard.deadline = now + timeout_;
      response.set_epoch(epoch);
      Describe(shard, static_cast<int64_t>(s), &response);
    }
  }
  response.set_live_workers(static_cast<int64_t>(holders_.size()));
  response.set_epochs_done(epochs_done_);
  response.set_members(Members());
  return response;
}

void DataLeases::Describe(const TableShard& shard, int64_t index, wire::LeaseResponse* response) const {
  response->set_lease(shard.lease);
  response->set_shard(index);
  response->set_begin(shard.offset);
  response->set_end(std::min(layout_.examples, (index + 1) * layout_.shard_examples));
  for (int64_t cut : shard.cuts) {
    if (cut > shard.offset && cut < response->end()) response->add_cuts(cut);
  }
}

void DataLeases::ReturnLease(int64_t lease, bool finished) {
  for (auto& [epoch, shards] : open_epochs_) {
    for (TableShard& shard : shards) {
      if (shard.state != ShardState::kLeased || shard.lease != lease) continue;
      shard.state = finished ? ShardState::kFinished : ShardState::kQueued;
      Release(shard);
    }
  }
  // Epochs whose every shard is finished close, in order.
  while (!open_epochs_.empty()) {
    auto& [epoch, shards] = *open_epochs_.begin();
    if (!std::all_of(shards.begin(), shards.end(),
                     [](const TableShard& s) { return s.state == ShardState::kFinished; })) {
      break;
    }
    epochs_done_ = epoch + 1;
    open_epochs_.erase(open_epochs_.begin());
  }
}

DataLeases::TableShard* DataLeases::NextFreeShard(int64_t epochs, int64_t* epoch, int64_t* shard) {
  auto find_queued = [&]() -> TableShard* {
    for (auto& [e, shards] : open_epochs_) {
      if (epochs > 0 && e >= epochs) break;  // a restored table may hold more than this run trains
      for (size_t s = 0; s < shards.size(); ++s) {
        if (shards[s].state != ShardState::kQueued) continue;
        *epoch = e;
        *shard = static_cast<int64_t>(s);
        return &shards[s];
      }
    }
    return nullptr;
  };
  if (TableShard* queued = find_queued(); queued != nullptr) return queued;
  if (open_epochs_.size() >= 2) return nullptr;  // every open shard is out: ask again
  const int64_t next = open_epochs_.empty() ? epochs_done_ : open_epochs_.rbegin()->first + 1;
  if (epochs > 0 && next >= epochs) return nullptr;  // the job's data is handed out
  std::vector<TableShard>& shards = open_epochs_[next];
  shards.resize(layout_.shards_per_epoch());
  for (size_t s = 0; s < shards.size(); ++s) shards[s].offset = static_cast<int64_t>(s) * layout_.shard_examples;
  return find_queued();
}

absl::StatusOr<DataLeases::Admission> DataLeases::Admit(const wire::DataProgress& progress, absl::Time now) {
  const int64_t begin = progress.begin(), end = progress.end();
  if (progress.lease() <= 0 || progress.epoch() < 0 || progress.epoch() > kMaxEpoch || progress.shard() < 0 ||
      progress.shard_begin() < 0 || begin < progress.shard_begin() || end <= begin || end > kMaxExamples) {
    return absl::InvalidArgumentError(absl::StrCat(
        "update to ", task_name_, " carries malformed progress: lease ", progress.lease(), ", epoch ", progress.epoch(),
        ", shard ", progress.shard(), " from ", progress.shard_begin(), ", places [", begin, ", ", end, ")"));
  }
  Admission admission;
  admission.leases_ = this;
  admission.progress_ = progress;
  admission.now_ = now;
  {
    std::lock_guard<std::mutex> lock(table_mu_);
    if (has_table_) {
      // The counter task: only the lease's holder may move its shard.
      auto open = open_epochs_.find(progress.epoch());
      const int64_t shards = layout_.shards_per_epoch();
      const bool held = open != open_epochs_.end() && progress.shard() < shards &&
                        open->second[progress.shard()].state == ShardState::kLeased &&
                        open->second[progress.shard()].lease == progress.lease();
      admission.answer_.set_live_workers(static_cast<int64_t>(holders_.size()));
      if (!held) {
        admission.answer_.set_lease_lost(true);
        return admission;
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(shards_mu_);
    if (progress.epoch() < finished_below_epoch_) {
      admission.answer_.set_watermark(end);  // a restored job finished that epoch
      return admission;
    }
    auto key = std::make_pair(progress.epoch(), progress.shard());
    auto found = shards_.find(key);
    if (found == shards_.end()) {
      if (shards_.size() >= kMaxTrackedShards) {
        // The oldest epoch's shards go first: they are long applied everywhere.
        const int64_t oldest = shards_.begin()->first.first;
        if (oldest >= progress.epoch()) {
          return absl::ResourceExhaustedError(absl::StrCat(task_name_, " tracks ", shards_.size(),
                                                           " shards' progress, its limit"));
        }
        shards_.erase(shards_.begin(), shards_.lower_bound({oldest + 1, 0}));
      }
      auto made = std::make_unique<ShardProgress>();
      made->watermark = progress.shard_begin();
      found = shards_.emplace(key, std::move(made)).first;
    }
    admission.shard_ = found->second.get();
  }
  // A checkpoint's snapshot (Frozen) waits for this update to commit.
  save_mu_.ReaderLock();
  admission.unfrozen_.reset(&save_mu_);
  admission.lock_ = std::unique_lock<std::mutex>(admission.shard_->mu);
  ShardProgress& shard = *admission.shard_;
  if (progress.lease() < shard.newest_lease) {
    admission.answer_.set_lease_lost(true);  // superseded: another worker holds the shard now
  } else {
    shard.newest_lease = progress.lease();
    admission.apply_ = begin == shard.watermark;
  }
  admission.answer_.set_watermark(shard.watermark);
  return admission;
}

void DataLeases::Admission::Commit() {
  if (!apply_ || leases_ == nullptr) return;
  leases_->CommitAdmission(*this);
  apply_ = false;
}

void DataLeases::Admission::CommitAccumulated() {
  if (apply_ && leases_ != nullptr) leases_->accumulated_ = true;
  Commit();
}

std::vector<wire::ShardMark> DataLeases::Frozen::Marks(int64_t from_epoch, bool* exact) const {
  *exact = !leases_.accumulated_;
  std::vector<wire::ShardMark> marks;
  std::lock_guard<std::mutex> lock(leases_.shards_mu_);
  for (auto it = leases_.shards_.lower_bound({from_epoch, 0}); it != leases_.shards_.end(); ++it) {
    std::lock_guard<std::mutex> shard_lock(it->second->mu);
    wire::ShardMark& mark = marks.emplace_back();
    mark.set_epoch(it->first.first);
    mark.set_shard(it->first.second);
    mark.set_watermark(it->second->watermark);
  }
  return marks;
}

void DataLeases::CommitAdmission(Admission& admission) {
  const wire::DataProgress& progress = admission.progress_;
  admission.shard_->watermark = progress.end();
  admission.answer_.set_watermark(progress.end());
  admission.answer_.set_applied(true);
  {
    std::lock_guard<std::mutex> lock(table_mu_);
    if (has_table_) {
      auto open = open_epochs_.find(progress.epoch());
      if (open != open_epochs_.end()) {
        TableShard& shard = open->second[progress.shard()];
        if (shard.lease == progress.lease()) {
          // Every task applied the places before this update's begin: the
          // sender's begin is the least of their watermarks.
          shard.offset = std::max(shard.offset, progress.begin());
          shard.deadline = admission.now_ + timeout_;
        }
      }
    }
  }
  std::lock_guard<std::mutex> lock(ledger_mu_);
  Record(progress.epoch(), progress.begin(), progress.end());
}

void DataLeases::Record(int64_t epoch, int64_t begin, int64_t end) {
  if (ledger_.size() >= kLedgerEpochs && epoch < ledger_.begin()->first) return;
  EpochLedgerRecord& record = ledger_[epoch];
  while (ledger_.size() > kLedgerEpochs) ledger_.erase(ledger_.begin());
  std::map<int64_t, int64_t>& ranges = record.ranges;
  // Merge [begin, end) in, counting the places it overlaps as repeats.
  auto it = ranges.upper_bound(begin);
  if (it != ranges.begin()) --it;
  int64_t merged_begin = begin, merged_end = end;
  while (it != ranges.end() && it->first <= end) {
    if (it->second < begin) {
      ++it;
      continue;
    }
    record.repeated += std::max<int64_t>(0, std::min(it->second, end) - std::max(it->first, begin));
    merged_begin = std::min(merged_begin, it->first);
    merged_end = std::max(merged_end, it->second);
    it = ranges.erase(it);
  }
  ranges[merged_begin] = merged_end;
}

wire::LeaseTableState DataLeases::Snapshot() const {
  std::lock_guard<std::mutex> lock(table_mu_);
  wire::LeaseTableState state;
  if (!has_table_) return state;
  state.set_data_fingerprint(layout_.fingerprint);
  state.set_examples(layout_.examples);
  state.set_shard_examples(layout_.shard_examples);
  state.set_epochs_done(epochs_done_);
  // Open epochs are consecutive from epochs_done_.
  for (const auto& [epoch, shards] : open_epochs_) {
    for (const TableShard& shard : shards) {
      state.add_shard_offsets(shard.state == ShardState::kFinished ? -1 : shard.offset);
    }
  }
  return state;
}

absl::Status DataLeases::Restore(const wire::LeaseTableState& state, bool hands_out_leases,
                                 const std::vector<wire::ShardMark>* marks) {
  Layout layout{state.data_fingerprint(), state.examples(), state.shard_examples()};
  if (layout.fingerprint == 0 || layout.examples <= 0 || layout.examples > kMaxExamples ||
      layout.shard_examples <= 0 || state.epochs_done() < 0 || state.epochs_done() > kMaxEpoch) {
    return absl::InvalidArgumentError(absl::StrCat("lease table restored onto ", task_name_,
                                                   " does not describe a training set"));
  }
  const int64_t per_epoch = layout.shards_per_epoch();
  if (per_epoch > static_cast<int64_t>(kMaxTrackedShards) / 4 || state.shard_offsets_size() % per_epoch != 0 ||
      state.shard_offsets_size() / per_epoch > kMaxRestoredEpochs) {
    return absl::InvalidArgumentError(absl::StrCat("lease table restored onto ", task_name_, " lists ",
                                                   state.shard_offsets_size(), " shards, not one to ",
                                                   kMaxRestoredEpochs, " epochs of ", per_epoch));
  }
  const int64_t open_epochs = state.shard_offsets_size() / per_epoch;
  // A mark or a cut names an open shard and a place of it.
  auto check_place = [&](const wire::ShardMark& mark, const char* what) -> absl::Status {
    const int64_t begin = mark.shard() * layout.shard_examples;
    const int64_t end = std::min(layout.examples, begin + layout.shard_examples);
    if (mark.epoch() < state.epochs_done() || mark.epoch() >= state.epochs_done() + open_epochs ||
        mark.shard() < 0 || mark.shard() >= per_epoch || mark.watermark() < begin || mark.watermark() > end) {
      return absl::InvalidArgumentError(absl::StrCat("lease table restored onto ", task_name_, ": a ", what,
                                                     " at place ", mark.watermark(), " of epoch ", mark.epoch(),
                                                     ", shard ", mark.shard(), " is not a place of an open shard"));
    }
    return absl::OkStatus();
  };
  for (const wire::ShardMark& cut : state.cuts()) SHOAL_RETURN_IF_ERROR(check_place(cut, "cut"));
  if (marks != nullptr) {
    for (const wire::ShardMark& mark : *marks) SHOAL_RETURN_IF_ERROR(check_place(mark, "watermark"));
  }
  for (int i = 0; i < state.shard_offsets_size(); ++i) {
    const int64_t s = i % per_epoch, offset = state.shard_offsets(i);
    const int64_t begin = s * layout.shard_examples, end = std::min(layout.examples, begin + layout.shard_examples);
    if (offset != -1 && (offset < begin || offset > end)) {
      return absl::InvalidArgumentError(absl::StrCat("lease table restored onto ", task_name_, ": shard ", s,
                                                     " resumes at ", offset, ", outside its places [", begin, ", ",
                                                     end, ")"));
    }
  }
  // Checked whole; now change.
  std::map<std::pair<int64_t, int64_t>, int64_t> watermarks;  // open shards: where each resumes here
  for (int i = 0; i < state.shard_offsets_size(); ++i) {
    const int64_t epoch = state.epochs_done() + i / per_epoch, s = i % per_epoch;
    const int64_t end = std::min(layout.examples, (s + 1) * layout.shard_examples);
    if (marks != nullptr) {
      watermarks[{epoch, s}] = s * layout.shard_examples;  // no update of it had reached this task
    } else {
      watermarks[{epoch, s}] = state.shard_offsets(i) == -1 ? end : state.shard_offsets(i);
    }
  }
  if (marks != nullptr) {
    for (const wire::ShardMark& mark : *marks) watermarks[{mark.epoch(), mark.shard()}] = mark.watermark();
  }
  if (hands_out_leases) {
    std::lock_guard<std::mutex> lock(table_mu_);
    has_table_ = true;
    layout_ = layout;
    epochs_done_ = state.epochs_done();
    open_epochs_.clear();
    holders_.clear();
    members_.clear();
    for (int i = 0; i < state.shard_offsets_size(); ++i) {
      std::vector<TableShard>& shards = open_epochs_[state.epochs_done() + i / per_epoch];
      TableShard shard;
      const int64_t offset = state.shard_offsets(i);
      shard.state = offset == -1 ? ShardState::kFinished : ShardState::kQueued;
      shard.offset = offset == -1 ? 0 : offset;
      shards.push_back(shard);
    }
    for (const wire::ShardMark& cut : state.cuts()) {
      std::vector<int64_t>& cuts = open_epochs_[cut.epoch()][cut.shard()].cuts;
      cuts.insert(std::upper_bound(cuts.begin(), cuts.end(), cut.watermark()), cut.watermark());
    }
  }
  {
    std::lock_guard<std::mutex> lock(shards_mu_);
    finished_below_epoch_ = state.epochs_done();
    for (auto& [key, progress] : shards_) {
      std::lock_guard<std::mutex> shard_lock(progress->mu);
      auto kept = watermarks.find(key);
      // A shard the checkpoint had not opened starts again from its first place.
      progress->watermark = kept != watermarks.end() ? kept->second : key.second * layout.shard_examples;
    }
    for (const auto& [key, watermark] : watermarks) {
      if (shards_.count(key) != 0) continue;
      auto made = std::make_unique<ShardProgress>();
      made->watermark = watermark;
      shards_.emplace(key, std::move(made));
    }
  }
  // The ledger holds what the variables now hold: the open epochs' places
  // below each shard's restart place (applied before the checkpoint, by
  // this task or the one it replaces); later epochs went back with them.
  std::lock_guard<std::mutex> lock(ledger_mu_);
  for (auto it = ledger_.lower_bound(state.epochs_done()); it != ledger_.end();) it = ledger_.erase(it);
  for (int64_t e = 0; e < open_epochs; ++e) {
    const int64_t epoch = state.epochs_done() + e;
    for (int64_t s = 0; s < per_epoch; ++s) {
      const int64_t begin = s * layout.shard_examples, end = watermarks.at({epoch, s});
      if (end > begin) Record(epoch, begin, end);
    }
  }
  return absl::OkStatus();
}

DataLeases::Takeovers DataLeases::takeovers() const {
  std::lock_guard<std::mutex> lock(table_mu_);
  return takeovers_;
}

wire::LedgerResponse DataLeases::Ledger() const {
  std::lock_guard<std::mutex> lock(ledger_mu_);
  wire::LedgerResponse response;
  for (const auto& [epoch, record] : ledger_) {
    wire::EpochLedger* out = response.add_epochs();
    out->set_epoch(epoch);
    out->set_repeated_places(record.repeated);
    for (const auto& [begin, end] : record.ranges) {
      out->add_bounds(begin);
      out->add_bounds(end);
    }
  }
  return response;
}

std::vector<EpochCheck> CheckLedgers(const std::vector<wire::LedgerResponse>& ledgers, int64_t examples,
                                     int64_t epochs_finished) {
  std::map<int64_t, EpochCheck> checks;
  std::set<int64_t> epochs;
  for (const auto& ledger : ledgers) {
    for (const auto& epoch : ledger.epochs()) epochs.insert(epoch.epoch());
  }
  // A finished epoch after the oldest one kept that no ledger holds was
  // never applied at all.
  if (!epochs.empty()) {
    for (int64_t epoch = *epochs.begin(); epoch < epochs_finished; ++epoch) epochs.insert(epoch);
  }
  for (int64_t epoch : epochs) {
    EpochCheck& check = checks[epoch];
    check.epoch = epoch;
    check.applied_once = examples;
    for (const auto& ledger : ledgers) {
      // A task restored from a checkpoint mid-job (a ps task lost and
      // started again) keeps no ledger of the epochs before it.
      if (!ledger.epochs().empty() && epoch < ledger.epochs(0).epoch()) continue;
      int64_t covered = 0, repeated = 0;
      for (const auto& kept : ledger.epochs()) {
        if (kept.epoch() != epoch) continue;
        repeated = kept.repeated_places();
        for (int i = 0; i + 1 < kept.bounds_size(); i += 2) {
          covered += std::min(examples, kept.bounds(i + 1)) - std::min(examples, kept.bounds(i));
        }
      }
      check.repeated += repeated;
      check.applied_once = std::min(check.applied_once, covered);
      // A finished epoch must be whole on every task; a later one may stop anywhere.
      if (epoch < epochs_finished) check.missing = std::max(check.missing, examples - covered);
    }
  }
  std::vector<EpochCheck> out;
  for (auto& [epoch, check] : checks) out.push_back(check);
  return out;
}

}  // namespace shoal
