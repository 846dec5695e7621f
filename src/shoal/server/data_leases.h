// DataLeases: leased data, trained exactly once through workers that come,
// go, stall and die.
//
// Each epoch of the training set has an order (drawn by the workers from the
// seed and the epoch) whose places are cut into shards of consecutive places.
// Two roles, in the same object on every task:
//
//  - The counter task's lease table hands shards to workers as they ask
//    (Lease). A lease lives while its holder's updates renew it; one not
//    renewed within its timeout goes back to the queue, to resume from the
//    place every task has applied up to (`offset`, the begin of the holder's
//    last update, since a worker's next update starts at the least of the
//    tasks' watermarks). A holder returns a lease finished once every task
//    applied its shard to the end.
//  - Every task applies a shard's places in order and each at most once:
//    an update's (shard, [begin, end)) is admitted (Admit) only when begin is
//    the shard's watermark here; places below it are answered "already
//    applied" and change nothing, places beyond it (a gap) are answered with
//    the watermark. The admission holds the shard's lock while the caller
//    applies the update, and Commit moves the watermark in the same step: an
//    update and its progress are one atomic change. A worker that dies
//    between tasks of one update leaves their watermarks one update apart;
//    whoever holds the lease next resumes from the lower one, and the tasks
//    ahead answer "already applied" until the others catch up.
//
// A checkpoint's snapshot of a task is taken while no update is admitted
// there (Frozen: those admitted commit first), with the task's watermarks
// (Marks): the saved variables hold exactly the places below them. Restored
// with them (Restore's `marks`), each task resumes where its own variables
// stand; the lease table resumes each shard at the least of the tasks'
// marks and cuts its batches at the others, so that no update straddles a
// task's mark (LeaseResponse.cuts).
//
// The ledger (proof, not mechanism): every admitted range is recorded per
// epoch as merged ranges, with places applied more than once counted; a
// checker confirms that each place of each finished epoch was applied once.
//
// Thread safety: every method may be called from many threads.
#ifndef SHOAL_SERVER_DATA_LEASES_H_
#define SHOAL_SERVER_DATA_LEASES_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "shoal/wire.pb.h"

namespace shoal {

// Counters the counter task keeps of DataLeases::takeovers (milliseconds).
inline constexpr char kLeaseTakeoversCounter[] = "data_leases/takeovers";
inline constexpr char kLeaseTakeoverMsCounter[] = "data_leases/takeover_ms";
inline constexpr char kLeaseLongestTakeoverMsCounter[] = "data_leases/longest_takeover_ms";
// Workers that joined a running job, and their milliseconds from start to
// their first applied update, summed (bumped by the workers).
inline constexpr char kJoinsCounter[] = "data_leases/joins";
inline constexpr char kJoinMsCounter[] = "data_leases/join_ms";

// One shard's progress on a task (DataLeases).
struct ShardProgress {
  std::mutex mu;  // held by an Admission while its update is applied
  int64_t watermark = 0;
  int64_t newest_lease = 0;  // a lease below it was superseded
};

// Releases a reader's hold of an absl::Mutex (DataLeases::Admission).
struct ReaderUnlock {
  void operator()(absl::Mutex* mu) const { mu->ReaderUnlock(); }
};

class DataLeases {
 public:
  explicit DataLeases(std::string task_name) : task_name_(std::move(task_name)) {}

  // The counter task: hands back `request.return_lease` (if any), then hands
  // out the next free shard: the lowest queued one of the open epochs, a new
  // epoch opened when every shard of the newest is out (at most two epochs
  // open). A request whose data is not the table's is refused.
  absl::StatusOr<wire::LeaseResponse> Lease(const wire::LeaseRequest& request, absl::Time now);

  // An update's places, admitted or answered. While it lives, the shard's
  // updates on this task wait for it.
  class Admission {
   public:
    Admission() = default;
    Admission(Admission&&) = default;
    Admission& operator=(Admission&&) = default;
    // Whether the caller should apply the update.
    bool apply() const { return apply_; }
    // The answer so far (watermark, applied, lease_lost).
    const wire::ProgressAnswer& answer() const { return answer_; }
    // The update was applied: the watermark moves to its end, the ledger
    // records its places, and on the counter task its lease is renewed.
    void Commit();
    // The same for a sync gradient taken into an accumulator: its places are
    // in the variables only once the step applies, so this task's marks no
    // longer say what a snapshot of its variables holds (Marks).
    void CommitAccumulated();

   private:
    friend class DataLeases;
    DataLeases* leases_ = nullptr;
    ShardProgress* shard_ = nullptr;
    std::unique_ptr<absl::Mutex, ReaderUnlock> unfrozen_;  // a Frozen waits for it
    std::unique_lock<std::mutex> lock_;
    wire::DataProgress progress_;
    absl::Time now_;
    bool apply_ = false;
    wire::ProgressAnswer answer_;
  };
  // Checks `progress` (bounds; on the counter task, that the sender holds
  // the lease) and decides. An error for a malformed progress record.
  absl::StatusOr<Admission> Admit(const wire::DataProgress& progress, absl::Time now);

  // While it lives no update is admitted here; it waits for those admitted
  // to commit. A checkpoint snapshots the task's variables under it.
  class Frozen {
   public:
    explicit Frozen(DataLeases& leases) : leases_(leases), lock_(&leases.save_mu_) {}
    Frozen(const Frozen&) = delete;
    Frozen& operator=(const Frozen&) = delete;
    // This task's watermarks of the shards of `from_epoch` on that it has
    // seen an update of (a shard not listed stands at its first place).
    // Whether they are exact: false once a sync gradient was committed
    // into an accumulator (CommitAccumulated).
    std::vector<wire::ShardMark> Marks(int64_t from_epoch, bool* exact) const;

   private:
    DataLeases& leases_;
    absl::WriterMutexLock lock_;
  };

  // The lease table as a checkpoint keeps it (the counter task's; empty
  // elsewhere). Leases held now are kept as queued at their offsets.
  wire::LeaseTableState Snapshot() const;
  // Puts a checkpoint's table back: on the counter task (`hands_out_leases`),
  // every lease is dropped and the shards queue at their offsets, with
  // their cuts; on every task the watermarks go to `marks` (this task's, as
  // Frozen::Marks saved them; a shard not listed to its first place) or,
  // without marks, to the offsets, and the ledger's open epochs hold the
  // places below them (the variables went back with them).
  absl::Status Restore(const wire::LeaseTableState& state, bool hands_out_leases,
                       const std::vector<wire::ShardMark>* marks = nullptr);

  // The ledger, for the exactly-once check.
  wire::LedgerResponse Ledger() const;

  // Shards whose lease ran out and that another worker took over: how many,
  // and the time from the last update of the lost holder (about when it
  // died or stalled) to the new lease, summed and the longest.
  struct Takeovers {
    int64_t count = 0;
    absl::Duration total, longest;
  };
  Takeovers takeovers() const;

  // Most epochs the ledger keeps (the newest), and most shards a task tracks.
  static constexpr int kLedgerEpochs = 64;
  static constexpr size_t kMaxTrackedShards = 1 << 16;
  // Most open epochs a restored table may hold: two, and those a save's
  // marks reached while the save ran.
  static constexpr int kMaxRestoredEpochs = 4;

 private:
  enum class ShardState { kQueued, kLeased, kFinished };
  struct TableShard {
    ShardState state = ShardState::kQueued;
    int64_t offset = 0;  // where training resumes
    int64_t lease = 0;
    std::string holder;
    absl::Time deadline;
    absl::Time lost_at = absl::InfinitePast();  // an expired lease's last renewal, until the shard is leased again
    std::vector<int64_t> cuts;  // restored: tasks' marks above the offset, ascending
  };
  struct Layout {
    int64_t fingerprint = 0, examples = 0, shard_examples = 0;
    int64_t shards_per_epoch() const { return (examples + shard_examples - 1) / shard_examples; }
  };
  struct EpochLedgerRecord {
    std::map<int64_t, int64_t> ranges;  // begin -> end, disjoint, merged
    int64_t repeated = 0;
  };

  // Under table_mu_.
  int64_t Members() const;
  void ExpireLeases(absl::Time now);
  void ReturnLease(int64_t lease, bool finished);
  // Hands the shard's lease back from its holder (holders_ with it).
  void Release(TableShard& shard);
  // A lease request with `renew`: the lease's deadline moves on, if its
  // holder still holds it.
  wire::LeaseResponse Renew(const wire::LeaseRequest& request, absl::Time now);
  // A queued shard of an open epoch, else the first of a newly opened one
  // below `epochs` (0: no end); null when every shard there is out.
  TableShard* NextFreeShard(int64_t epochs, int64_t* epoch, int64_t* shard);
  absl::Status CheckLayout(const wire::LeaseRequest& request) const;
  // Under ledger_mu_.
  void Record(int64_t epoch, int64_t begin, int64_t end);
  void CommitAdmission(Admission& admission);
  // The lease's places and cuts in `response`.
  void Describe(const TableShard& shard, int64_t index, wire::LeaseResponse* response) const;

  const std::string task_name_;

  mutable std::mutex table_mu_;
  bool has_table_ = false;  // set by the first Lease: this task hands out leases
  Layout layout_;
  int64_t epochs_done_ = 0;                                // every epoch below is finished
  std::map<int64_t, std::vector<TableShard>> open_epochs_;  // epoch -> its shards
  int64_t last_lease_ = 0;
  // Worker -> the leases it holds. Its size is the live workers: those a
  // sync step can wait for (one waiting for a free shard has no gradient to
  // give).
  std::map<std::string, int> holders_;
  // Worker -> when its last lease request was a lease timeout ago: with
  // holders_, the workers still in the job (LeaseResponse.members), those
  // waiting for a shard or told the data is over included, until they
  // leave. The chief waits for none to be left before it ends the job.
  std::map<std::string, absl::Time> members_;
  absl::Duration timeout_ = absl::Seconds(10);
  Takeovers takeovers_;

  absl::Mutex save_mu_;  // readers: admissions, until they commit; the writer: a Frozen
  std::atomic<bool> accumulated_{false};  // a sync gradient was committed (CommitAccumulated)

  mutable std::mutex shards_mu_;  // guards the map, not the entries
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<ShardProgress>> shards_;
  int64_t finished_below_epoch_ = 0;  // restored: epochs below are applied everywhere

  mutable std::mutex ledger_mu_;
  std::map<int64_t, EpochLedgerRecord> ledger_;
};

// What the ledgers of every task say of an epoch of `examples` places.
struct EpochCheck {
  int64_t epoch = 0;
  int64_t applied_once = 0;  // places applied (at least once) on every task
  int64_t missing = 0;       // places some task never applied
  int64_t repeated = 0;      // repeats, summed over tasks
};
// Checks the ledgers of the tasks that hold variables: every epoch below
// `epochs_finished` must have every place applied exactly once on each task;
// a later epoch may be partial but must hold no repeat. A finished epoch
// after the oldest that any ledger keeps, and kept by none, counts whole as
// missing; older ones (before the checkpoint a job resumed from, or past
// the ledgers' window) are not checked, nor, on a task, the epochs before
// its oldest (it was restored past them).
std::vector<EpochCheck> CheckLedgers(const std::vector<wire::LedgerResponse>& ledgers, int64_t examples,
                                     int64_t epochs_finished);

}  // namespace shoal

#endif  // SHOAL_SERVER_DATA_LEASES_H_
