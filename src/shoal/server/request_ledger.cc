#include "shoal/server/request_ledger.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace shoal {

RequestLedger::ClientRecord& RequestLedger::Touch(uint64_t client) {
  auto found = clients_.find(client);
  if (found != clients_.end()) {
    recency_.splice(recency_.begin(), recency_, found->second.recency);
    return found->second;
  }
  if (static_cast<int>(clients_.size()) >= limits_.max_clients) {
    clients_.erase(recency_.back());
    recency_.pop_back();
  }
  recency_.push_front(client);
  ClientRecord& record = clients_[client];
  record.recency = recency_.begin();
  return record;
}

void RequestLedger::Settle(const SettledNumbers& settled, ClientRecord* record) {
  auto listed = [&](uint64_t id) {
    return std::binary_search(settled.unfinished.begin(), settled.unfinished.end(), id);
  };
  // A number stays unfinished only if this report leaves it so: above what
  // it covers, or listed in it. Those it covers first come from its list.
  for (auto it = record->unfinished.begin(); it != record->unfinished.end();) {
    it = *it < settled.known_below && !listed(*it) ? record->unfinished.erase(it) : std::next(it);
  }
  for (uint64_t id : settled.unfinished) {
    if (id >= record->known_below) record->unfinished.insert(id);
  }
  record->known_below = std::max(record->known_below, settled.known_below);
  for (auto it = record->requests.begin(); it != record->requests.end() && it->first < record->known_below;) {
    it = IsSettled(*record, it->first) ? record->requests.erase(it) : std::next(it);
  }
}

bool RequestLedger::IsSettled(const ClientRecord& record, uint64_t request_id) {
  return request_id < record.known_below && record.unfinished.count(request_id) == 0;
}

absl::StatusOr<std::optional<wire::ResponseHeader>> RequestLedger::Begin(uint64_t client, uint64_t request_id,
                                                                         const SettledNumbers& settled) {
  if (settled.unfinished.size() > kMaxUnfinishedListed) {
    return absl::InvalidArgumentError(absl::StrCat(task_name_, ": request ", request_id, " of client ", client,
                                                   " lists ", settled.unfinished.size(),
                                                   " unfinished requests, more than the ", kMaxUnfinishedListed,
                                                   " one may"));
  }
  for (size_t i = 0; i < settled.unfinished.size(); ++i) {
    if (settled.unfinished[i] >= settled.known_below || (i > 0 && settled.unfinished[i] <= settled.unfinished[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          task_name_, ": request ", request_id, " of client ", client, " lists its unfinished requests out of order "
          "or at or above ", settled.known_below, " (", settled.unfinished[i], ")"));
    }
  }
  std::unique_lock lock(mu_);
  ClientRecord& record = Touch(client);
  Settle(settled, &record);
  if (IsSettled(record, request_id)) {
    return absl::FailedPreconditionError(absl::StrCat(task_name_, ": request ", request_id, " of client ", client,
                                                      " was answered before; not applying it again"));
  }
  if (record.requests.find(request_id) == record.requests.end()) {
    if (static_cast<int>(record.requests.size()) >= limits_.max_open_per_client) {
      return absl::ResourceExhaustedError(absl::StrCat(task_name_, ": client ", client, " has ",
                                                       record.requests.size(),
                                                       " requests unanswered, the most one client may have"));
    }
    record.requests.emplace(request_id, Entry{});
    return std::nullopt;
  }
  // A repeat: answer it as the original was answered.
  const auto give_up = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(limits_.wait_for_original);
  while (true) {
    auto still = clients_.find(client);
    const auto entry = still == clients_.end() ? std::map<uint64_t, Entry>::iterator()
                                               : still->second.requests.find(request_id);
    if (still == clients_.end() || entry == still->second.requests.end()) {
      return absl::AbortedError(absl::StrCat(task_name_, ": request ", request_id, " of client ", client,
                                             " was forgotten while a repeat of it waited; not applying it again"));
    }
    if (entry->second.finished) return entry->second.answer;
    if (finished_.wait_until(lock, give_up) == std::cv_status::timeout) {
      return absl::UnavailableError(absl::StrCat(task_name_, ": request ", request_id, " of client ", client,
                                                 " is still being applied; try again"));
    }
  }
}

void RequestLedger::Finish(uint64_t client, uint64_t request_id, const wire::ResponseHeader& answer) {
  {
    std::lock_guard lock(mu_);
    auto found = clients_.find(client);
    if (found == clients_.end()) return;
    auto entry = found->second.requests.find(request_id);
    if (entry == found->second.requests.end()) return;  // settled meanwhile
    entry->second.finished = true;
    entry->second.answer = answer;
  }
  finished_.notify_all();
}

size_t RequestLedger::size() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [client, record] : clients_) n += record.requests.size();
  return n;
}

}  // namespace shoal
