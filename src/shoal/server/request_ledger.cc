#include "shoal/server/request_ledger.h"

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

absl::StatusOr<std::optional<wire::ResponseHeader>> RequestLedger::Begin(uint64_t client, uint64_t request_id,
                                                                         uint64_t first_unfinished) {
  std::unique_lock lock(mu_);
  ClientRecord& record = Touch(client);
  if (first_unfinished > record.settled_below) {
    record.settled_below = first_unfinished;
    record.requests.erase(record.requests.begin(), record.requests.lower_bound(first_unfinished));
  }
  if (request_id < record.settled_below) {
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
