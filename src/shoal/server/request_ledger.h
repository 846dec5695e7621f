// RequestLedger: the changing requests a server has applied, so that a
// repeat is answered, never applied twice.
//
// A client numbers its requests and sends a retry (after a dropped
// connection, say) with the same number. Which of the two reaches the server
// first is not known: the retry may even overtake an original that is still
// being decoded. The first to arrive is applied; the other waits for it and
// gets the same answer. Each request also says which of that client's
// numbers are settled (answered): every number below a bound except those
// it lists as still in flight. The ledger forgets those, and a settled
// number that turns up again is refused rather than applied. So one slow
// request among many overlapping ones holds only its own entry, not every
// later one's. Memory is bounded: at most `max_clients` clients (the least
// recently heard from is forgotten first) and `max_open_per_client`
// unsettled requests each.
#ifndef SHOAL_SERVER_REQUEST_LEDGER_H_
#define SHOAL_SERVER_REQUEST_LEDGER_H_

#include <condition_variable>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "shoal/wire.pb.h"

namespace shoal {

// What a request says of its client's other numbers: every number below
// `known_below` has been answered, except `unfinished` (ascending, each
// below `known_below`).
struct SettledNumbers {
  uint64_t known_below = 0;
  std::vector<uint64_t> unfinished;
};

// The most numbers a request may list as unfinished.
inline constexpr size_t kMaxUnfinishedListed = 1024;

struct RequestLedgerLimits {
  int max_clients = 1024;
  int max_open_per_client = 256;
  // How long a repeat waits for its original's answer.
  absl::Duration wait_for_original = absl::Seconds(30);
};

class RequestLedger {
 public:
  explicit RequestLedger(std::string task_name, RequestLedgerLimits limits = {})
      : task_name_(std::move(task_name)), limits_(limits) {}

  // Request `request_id` of `client`, which says which of its numbers are
  // settled. Returns nothing when the request is new: the caller applies it
  // and then calls Finish. Returns the answer when it is a repeat (after
  // waiting for the original if that is still being applied). An error for
  // a number already settled, a malformed `settled` (nothing changes then),
  // a client with too many unsettled requests, or an original that took too
  // long.
  absl::StatusOr<std::optional<wire::ResponseHeader>> Begin(uint64_t client, uint64_t request_id,
                                                            const SettledNumbers& settled);
  // As a client that says only that every number below `first_unfinished`
  // is answered.
  absl::StatusOr<std::optional<wire::ResponseHeader>> Begin(uint64_t client, uint64_t request_id,
                                                            uint64_t first_unfinished) {
    return Begin(client, request_id, SettledNumbers{first_unfinished, {}});
  }
  // Records the answer to a request Begin called new, waking its repeats.
  void Finish(uint64_t client, uint64_t request_id, const wire::ResponseHeader& answer);

  // How many requests are recorded (for tests of the bounds).
  size_t size() const;

 private:
  struct Entry {
    bool finished = false;
    wire::ResponseHeader answer;
  };
  struct ClientRecord {
    // Numbers under `known_below` are settled, but for `unfinished` (those
    // the client's reports have all left in flight). Settled numbers are
    // forgotten and refused. The reports only ever settle more numbers, in
    // whatever order they arrive.
    uint64_t known_below = 0;
    std::set<uint64_t> unfinished;
    std::map<uint64_t, Entry> requests;
    std::list<uint64_t>::iterator recency;  // place in recency_
  };

  ClientRecord& Touch(uint64_t client);  // under mu_
  // Takes in what `settled` says (checked by the caller), forgetting the
  // requests it settles.
  static void Settle(const SettledNumbers& settled, ClientRecord* record);
  static bool IsSettled(const ClientRecord& record, uint64_t request_id);

  const std::string task_name_;
  const RequestLedgerLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable finished_;
  std::unordered_map<uint64_t, ClientRecord> clients_;
  std::list<uint64_t> recency_;  // clients, most recently heard from first
};

}  // namespace shoal

#endif  // SHOAL_SERVER_REQUEST_LEDGER_H_
