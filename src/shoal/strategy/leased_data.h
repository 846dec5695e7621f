// LeasedData: a worker's batches from shards of the whole training set that
// it leases from the counter task as it goes (data.leases;
// server/data_leases.h holds the table and the rules).
//
// A lease is a shard of one epoch's order (EpochOrder of training.seed and
// the epoch, the same on every worker). The worker trains it a batch at a
// time from where the lease resumes; each step's update carries the batch's
// places, and the tasks' answer moves the worker on (Settle): to the least
// of their watermarks, so a stale sync gradient or a task that missed an
// update sends the worker over those places again, and a lost lease (it
// stalled past the timeout and another worker took the shard) makes it ask
// for another. A shard trained to its end on every task goes back finished
// with the next lease request.
//
// A mode that trains several local steps per exchange (downpour,
// model_average, easgd) keeps its steps' batches local (KeepLocal): the
// next batch follows them and the places grow into one range of the shard,
// which the exchange carries as one update. Such a mode ends its exchange early when a batch
// ends the shard, since one update's places lie in one shard, or ends at a
// cut (UpdateMustGo).
//
// After a restore the tasks may stand at different places of a shard (each
// at its own checkpointed watermark): the lease names those places (cuts),
// and a batch ends at each, so that every task's next update begins at its
// watermark whatever the batch size.
//
// Not thread-safe: one per worker thread.
#ifndef SHOAL_STRATEGY_LEASED_DATA_H_
#define SHOAL_STRATEGY_LEASED_DATA_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "shoal/client/client.h"
#include "shoal/data/dataset.h"
#include "shoal/strategy/train_report.h"
#include "shoal/wire.pb.h"

namespace shoal {

// Examples in a leased shard: `configured`, or about 1/16 of an epoch in
// whole batches (at least one, at most 32).
int64_t LeaseShardExamples(int64_t configured, int64_t examples, int64_t batch_size);

// The exactly-once check of a job on leased data: every ps task's ledger
// against the lease table's finished epochs (server/data_leases.h,
// CheckLedgers), over `examples` places an epoch.
absl::StatusOr<DataLedgerReport> CheckJobLedgers(Client& client, int64_t examples);

class LeasedData {
 public:
  struct Options {
    std::string worker;  // the task's name: the lease's holder
    int64_t batch_size = 0;
    int64_t shard_examples = 0;  // LeaseShardExamples
    uint64_t seed = 0;           // training.seed: every worker's epoch orders
    int64_t data_fingerprint = 0;
    absl::Duration lease_timeout = absl::Seconds(10);
    // The job's epochs: once the lease table has finished them the data is
    // over (0: the job ends by its steps alone).
    int64_t epochs = 0;
  };
  LeasedData(Client& client, Dataset data, Options options);

  // The next batch and its places (progress()). Takes a lease when none is
  // held or the held one is used up (handing that one back finished). False
  // once every shard of the job's epochs is finished. While every open
  // shard is leased to others it asks again every 50 ms, until `job_over`
  // says the job is done (then false); if for three lease timeouts no shard
  // is free and no worker holds one, DeadlineExceeded.
  absl::StatusOr<bool> Next(torch::Tensor* images, torch::Tensor* labels,
                            const std::function<absl::StatusOr<bool>()>& job_over);
  // The places the step's update carries: those of the batch Next gave, and
  // before it any kept local since the last update (KeepLocal).
  const wire::DataProgress& progress() const { return progress_; }
  // The places of the batch Next gave alone: what its embedding rows' push
  // carries (every step, whatever the mode sends of the dense update).
  const wire::DataProgress& batch_progress() const { return batch_progress_; }
  // The step sent no update: its batch was trained into a local copy, and
  // the next batch follows it into the same update's places.
  void KeepLocal() { cursor_ = progress_.end(); }
  // The local steps since the last update are undone (a local copy thrown
  // away, say for the global one after a restore): the next batch begins
  // where the last update ended.
  void DropLocal() { cursor_ = sent_to_; }
  // Whether the update must go with the batch Next gave: it is the shard's
  // last, or it ends at a cut (a restored task's watermark, which no
  // update's places may straddle).
  bool UpdateMustGo() const;
  // The tasks' answer to the step's update: where the next batch begins.
  // An update that was never sent needs no answer: Next gives the same
  // places again.
  void Settle(const wire::ProgressAnswer& answer);
  // The workers holding a lease that has not run out, asked now with a
  // renewal of the lease held (a worker waiting at a barrier keeps its
  // shard). A lease that ran out meanwhile is dropped (another worker may
  // hold its shard now), once no places are kept local under it.
  absl::StatusOr<int64_t> AskLiveWorkers();
  // AskLiveWorkers, when a lease is held and a quarter of the lease timeout
  // has passed since the lease table last heard of it: a sync step's wait
  // sends no update that would renew it, nor does a local step.
  absl::Status RenewIfDue();
  // Hands the lease held back (a worker whose training is over), which
  // takes this worker out of the job's members; answers how many are left
  // (LeaseResponse.members: holding a lease, or asking for one within a
  // lease timeout). Asked again, it only counts them: the chief's wait.
  absl::StatusOr<int64_t> Leave();

  int64_t live_workers() const { return live_workers_; }
  int64_t leases_taken() const { return leases_taken_; }
  int64_t leases_lost() const { return leases_lost_; }

 private:
  // A lease request naming this worker and its data.
  wire::LeaseRequest Ask() const;
  // Asks for a lease, handing back the one held (finished when `finished`).
  absl::StatusOr<bool> TakeLease(bool finished);
  const torch::Tensor& OrderOf(int64_t epoch);

  Client& client_;
  const Dataset data_;
  const Options options_;
  wire::LeaseResponse lease_;  // lease() == 0: none held
  int64_t cursor_ = 0;         // the next batch's first place
  int64_t sent_to_ = 0;        // the next update's first place (below: answered by the tasks)
  wire::DataProgress progress_;
  wire::DataProgress batch_progress_;
  std::map<int64_t, torch::Tensor> orders_;  // the epochs' orders in use (at most two)
  int64_t live_workers_ = 0;
  absl::Time renewed_ = absl::InfinitePast();  // the lease table last heard of the lease held
  int64_t leases_taken_ = 0;
  int64_t leases_lost_ = 0;
};

}  // namespace shoal

#endif  // SHOAL_STRATEGY_LEASED_DATA_H_
