// Client: reads, assigns and updates any variable of the cluster by name.
//
// The client looks each name up in the Placement, groups the work by owning
// task, sends one request per task in parallel and waits for all of them
// (each with a deadline). Partitioned variables are split and reassembled
// here, so callers never see the parts.
//
// Usage (a worker's step):
//   auto values = client.Read(names);                 // pull
//   ... forward/backward with libtorch ...
//   client.ApplyGradients(names, grads, {{"global_step", 1}});   // push
//
// Thread-safe: a client may be used by several threads at once.
#ifndef SHOAL_CLIENT_CLIENT_H_
#define SHOAL_CLIENT_CLIENT_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "shoal/cluster/cluster_spec.h"
#include "shoal/placement/placement.h"
#include "shoal/server/optimizer.h"
#include "shoal/transport/transport.h"

namespace shoal {

struct ClientOptions {
  absl::Duration rpc_timeout = absl::Seconds(60);  // every call's deadline
  // The deadline for the answer to a checkpoint save or restore, which
  // takes as long as the shard is big (checkpoint.timeout_s); an
  // unreachable task is still tried again only within rpc_timeout.
  absl::Duration checkpoint_timeout = absl::Seconds(1800);
};

// A variable to create: its name, initial value and how it is trained.
struct VariableInit {
  std::string name;
  torch::Tensor value;
  wire::OptimizerConfig optimizer;
  bool use_locking = false;
  // Not trained (BatchNorm's running statistics): float32 or int64, read and
  // assigned, never given gradients; `optimizer` is ignored.
  bool buffer = false;
};

struct CounterDelta {
  std::string name;
  int64_t delta = 1;
};

// Two answers to one update's places (from two tasks, or the variables'
// and the rows') as one: the least watermark, applied where both were, the
// lease lost where either says so, the counter task's live count.
wire::ProgressAnswer CombineProgress(const wire::ProgressAnswer& a, const wire::ProgressAnswer& b);

// DeadlineExceeded for a synchronous step that gathered only `arrived` of
// `replicas` gradients within `timeout`, naming those of `workers` not in
// `heard_from`.
absl::Status IncompleteStepError(int64_t step, int arrived, int replicas, absl::Duration timeout,
                                 const std::vector<std::string>& workers, const std::vector<std::string>& heard_from);

class Client {
 public:
  // Connects (lazily) to every task of `cluster` through `transport`.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const ClusterSpec& cluster, Transport* transport,
                                                        std::shared_ptr<const Placement> placement,
                                                        ClientOptions options = {});

  // A client over the same connections whose calls have `rpc_timeout`
  // (populations read peers with a short deadline).
  std::unique_ptr<Client> WithTimeout(absl::Duration rpc_timeout) const;

  // Creates the variables on their tasks (the chief's job). Variables that
  // already exist with the same definition keep their values.
  absl::Status CreateVariables(const std::vector<VariableInit>& variables);

  // Waits until every named variable exists on its task (non-chief start-up),
  // polling; DeadlineExceeded after `timeout`, naming what is missing.
  absl::Status WaitForVariables(const std::vector<std::string>& names, absl::Duration timeout);
  // Tasks start in any order: waits, polling with backoff up to `timeout`,
  // until every task that holds one of `names` answers (whether it has them
  // or not), or DEADLINE_EXCEEDED with the last error, which names the task.
  absl::Status WaitForTasksHolding(const std::vector<std::string>& names, absl::Duration timeout);

  // Current values. In-process they may alias server memory: never write to
  // them (copy first). A read takes no lock: under concurrent applies it may
  // see an update half done, as in TensorFlow's asynchronous training.
  absl::StatusOr<std::vector<torch::Tensor>> Read(const std::vector<std::string>& names);

  // Synchronous training, the barrier and the pull in one call: the values
  // once every named variable's accumulator has reached `min_step` (that
  // step's gradients applied), waiting at most `wait` (capped by servers).
  struct StepValues {
    bool ready = false;  // false: `wait` ran out first, and no values
    int64_t step = 0;    // the lowest accumulator step, taken before the values
    std::vector<torch::Tensor> values;
    std::vector<std::string> heard_from;  // not ready: workers a waiting task heard from
  };
  absl::StatusOr<StepValues> ReadAtStep(const std::vector<std::string>& names, int64_t min_step, absl::Duration wait);

  // With `accumulator_step`, the variables' accumulators also start again,
  // empty, at that step (restoring a checkpoint in synchronous modes).
  absl::Status Assign(const std::vector<std::string>& names, const std::vector<torch::Tensor>& values,
                      std::optional<int64_t> accumulator_step = std::nullopt);

  // Sends gradients to be applied by each variable's optimizer, and bumps
  // `counters` (on the counter task) once the gradients are in. Returns the
  // counters' new values in order. `progress` and `answer`: as
  // ApplyGradientsAndRead's.
  absl::StatusOr<std::vector<int64_t>> ApplyGradients(const std::vector<std::string>& names,
                                                      const std::vector<torch::Tensor>& gradients,
                                                      const std::vector<CounterDelta>& counters = {},
                                                      const wire::DataProgress* progress = nullptr,
                                                      wire::ProgressAnswer* answer = nullptr);

  // ApplyGradients whose answer also brings the variables' values as they
  // are right after this apply: a push and the next step's pull in one
  // round trip (ps-lite's push-pull). Under async training another
  // worker's update may land between a push and a pull either way.
  struct AppliedValues {
    std::vector<int64_t> counters;
    std::vector<torch::Tensor> values;
  };
  // With `progress` (leased data), every task the gradients reach, and the
  // counter task, applies them only with their places (DataLeases::Admit),
  // and `answer` says where the tasks stand (GatherProgress).
  absl::StatusOr<AppliedValues> ApplyGradientsAndRead(const std::vector<std::string>& names,
                                                      const std::vector<torch::Tensor>& gradients,
                                                      const std::vector<CounterDelta>& counters = {},
                                                      const wire::DataProgress* progress = nullptr,
                                                      wire::ProgressAnswer* answer = nullptr);

  // Adds each delta to its variable's value (no optimizer; TensorFlow's
  // assign_add), then bumps `counters` as ApplyGradients does.
  absl::StatusOr<std::vector<int64_t>> AddToVariables(const std::vector<std::string>& names,
                                                      const std::vector<torch::Tensor>& deltas,
                                                      const std::vector<CounterDelta>& counters = {});
  // AddToVariables whose answer also brings the values right after the add.
  absl::StatusOr<AppliedValues> AddToVariablesAndRead(const std::vector<std::string>& names,
                                                      const std::vector<torch::Tensor>& deltas,
                                                      const std::vector<CounterDelta>& counters = {});

  // EASGD's exchange in one round trip: each variable moves towards the
  // worker's `copies` by `alpha` of their distance (value += alpha * (copy -
  // value), read and moved at once), then `counters` are bumped as
  // ApplyGradients does. `values` are the variables as they were just
  // before: the worker moves its copies by the same alpha * (copy - value).
  // A repeat after a lost answer brings them as they are then. `progress`
  // and `answer`: as ApplyGradientsAndRead's; a task that does not take the
  // move (its places were applied already, or the lease was lost) answers
  // with the variables as they are, unmoved.
  absl::StatusOr<AppliedValues> MoveTowards(const std::vector<std::string>& names,
                                            const std::vector<torch::Tensor>& copies, double alpha,
                                            const std::vector<CounterDelta>& counters = {},
                                            const wire::DataProgress* progress = nullptr,
                                            wire::ProgressAnswer* answer = nullptr);

  // Adds `delta` to a counter on the counter task; returns the new value.
  absl::StatusOr<int64_t> AddToCounter(const std::string& name, int64_t delta);

  // Adds each delta to its counter, in order, in one request to the counter
  // task (applied once, like any numbered request; a delta of 0 reads);
  // returns each counter's value after its own addition.
  absl::StatusOr<std::vector<int64_t>> AddToCounters(const std::vector<CounterDelta>& counters);

  // Sets a counter on the counter task to `value`, in one operation.
  absl::StatusOr<int64_t> SetCounter(const std::string& name, int64_t value);

  // One long poll (at most `wait`, capped by the server) for a counter to
  // reach `at_least`; returns its value, which may still be lower.
  absl::StatusOr<int64_t> PollCounter(const std::string& name, int64_t at_least, absl::Duration wait);

  // Synchronous training: sends this worker's gradients for `local_step` to
  // the variables' accumulators. Returns how many were dropped as stale.
  // With apply_at > 0 the servers apply each accumulator's mean as soon as
  // it holds apply_at gradients (no ApplyAccumulated needed). `counters`
  // ride to the counter task with the gradients, as ApplyGradients' do.
  // `progress` and `answer` as ApplyGradientsAndRead's.
  absl::StatusOr<int> Accumulate(const std::vector<std::string>& names, const std::vector<torch::Tensor>& gradients,
                                 int64_t local_step, const std::string& worker, int apply_at = 0,
                                 const std::vector<CounterDelta>& counters = {},
                                 const wire::DataProgress* progress = nullptr,
                                 wire::ProgressAnswer* answer = nullptr);

  // Leased data (server/data_leases.h): a lease from the counter task's
  // table; the table itself (restoring `state` onto every task first when
  // given, each task with the watermarks `marks_of` gives it, if any); and
  // the exactly-once ledgers: the variables' on every task that holds some
  // (and the counter task's), and each table's rows' on every task that
  // holds a shard of it (in `epochs`; `tables` names the table).
  absl::StatusOr<wire::LeaseResponse> Lease(const wire::LeaseRequest& request);
  using MarksOf = std::function<const wire::TaskMarks*(const TaskId&)>;
  absl::StatusOr<wire::LeaseTableState> LeaseTable(const wire::LeaseTableState* restore = nullptr,
                                                   const MarksOf& marks_of = nullptr);
  absl::StatusOr<std::vector<wire::LedgerResponse>> Ledgers();

  // The chief's side of a synchronous step: on every task, waits for
  // `replicas_to_aggregate` tensors per variable, uses their mean as `rule`
  // says (wire.proto: a gradient step, or for model averaging the new value)
  // and moves the accumulators to `new_step`. After `timeout`,
  // DeadlineExceeded naming the workers heard from and those missing (of
  // `workers`).
  absl::Status ApplyAccumulated(const std::vector<std::string>& names, int replicas_to_aggregate, int64_t new_step,
                                absl::Duration timeout, const std::vector<std::string>& workers,
                                wire::AccumulatedRule rule = wire::MEAN_GRADIENT);

  // Populations: new hyper-parameters for the named variables' optimizers
  // (same kind; the slots stay).
  absl::Status SetOptimizer(const std::vector<std::string>& names, const wire::OptimizerConfig& optimizer);

  // Copies of the named variables' optimizer slots (not for partitioned
  // variables), and replacing them (to inherit a member's training state bit
  // for bit, or restore a checkpoint; a partition takes its rows).
  absl::StatusOr<std::vector<OptimizerSlots>> ReadSlots(const std::vector<std::string>& names);
  absl::Status AssignSlots(const std::vector<std::string>& names, const std::vector<OptimizerSlots>& slots);

  // Whether each named variable exists on its task(s).
  absl::StatusOr<std::vector<bool>> VariablesExist(const std::vector<std::string>& names);

  // Checkpoints: asks each task of `shards` to write every variable it
  // holds, with its slots (and its tables beside them), as its shard of the
  // checkpoint at `step`, inside the checkpoint directory the task was
  // started with; the tasks write at once. Returns, per task, the names it
  // stored them under and the path it wrote.
  struct SavedShard {
    std::vector<std::string> names;
    std::string path;
    bool wrote_tables = false;  // the task held tables and wrote them beside the shard
    wire::TaskMarks marks;      // leased data: the watermarks of epochs from `marks_from_epoch` the shard holds
  };
  // The counter task also reads `step_counter` with its snapshot (its
  // SavedShard's marks.step).
  absl::StatusOr<std::map<TaskId, SavedShard>> SaveShards(const std::map<TaskId, int>& shards, int64_t step,
                                                          int64_t marks_from_epoch = 0,
                                                          const std::string& step_counter = "");

  // Asks `task`'s server to shut down.
  absl::Status Shutdown(const TaskId& task);

  // Embedding tables (server/embedding_table.h), split by row over every ps
  // task: row id mod the ps count. Creates each table's shard on every ps
  // task (`shard` and `num_shards` are filled in here).
  absl::Status CreateTables(const std::vector<wire::TableDef>& tables);
  // A caller whose ids are already distinct (an embedding bag's, each step)
  // says so, and the client does not de-duplicate them again; a push whose
  // ids repeat anyway is refused by the ps, naming the id.
  enum class Ids { kAny, kDistinct };
  // The rows of `ids` (int64 [n]; repeats allowed): float32 [n, dim]. Each
  // distinct id is pulled once, from its shard, all shards in parallel. No
  // ids: [0, dim], from the first shard.
  absl::StatusOr<torch::Tensor> PullRows(const std::string& table, const torch::Tensor& ids, Ids ids_are = Ids::kAny);
  // How full a table is, summed over its shards (wire.proto: PullRowsResponse).
  struct TableOccupancy {
    int64_t rows_held = 0;
    int64_t ids_refused = 0;
    int64_t rows_evicted = 0;
  };
  absl::StatusOr<TableOccupancy> Occupancy(const std::string& table);
  // Sums the gradient rows ([n, dim]) of repeated ids, then pushes each
  // shard its distinct ids and their rows, in parallel. With `progress`
  // (leased data: the batch's places) every shard hears of the push, with
  // rows or none, and applies its rows only with their places; `answer`
  // says where the shards stand (as ApplyGradientsAndRead's).
  absl::Status PushRows(const std::string& table, const torch::Tensor& ids, const torch::Tensor& gradients,
                        Ids ids_are = Ids::kAny, const wire::DataProgress* progress = nullptr,
                        wire::ProgressAnswer* answer = nullptr);
  // Has every ps task restore its share of the tables from the table files
  // the checkpoint at `step` holds for `shards` (wire.proto:
  // RestoreTablesRequest): any ps count restores any other's. Returns the
  // rows set over all tasks.
  absl::StatusOr<int64_t> RestoreTables(int64_t step, const std::vector<int>& shards);
  // The ps tasks in index order: a table's shards (none: FailedPrecondition).
  absl::StatusOr<std::vector<TaskId>> TableShards() const;

  const Placement& placement() const { return *placement_; }

  // How many times a task answered with another incarnation than before:
  // it was restarted (and has lost what it held) since this client last
  // heard from it.
  int64_t restarts_seen() const { return restarts_seen_.load(std::memory_order_relaxed); }

  // How many calls were sent again because their task was unreachable.
  int64_t retries() const { return retries_.load(std::memory_order_relaxed); }

  // Requests this client has sent, one per task a call reaches (a retry
  // counts once): its round trips.
  int64_t requests_sent() const { return requests_sent_.load(std::memory_order_relaxed); }

  // Bytes this client has sent and received (frames: header and tensors),
  // counted alike over every transport; and of those, the tensor bytes sent.
  int64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  int64_t bytes_received() const { return bytes_received_.load(std::memory_order_relaxed); }
  int64_t tensor_bytes_sent() const { return tensor_bytes_sent_.load(std::memory_order_relaxed); }

 private:
  struct TaskCall;  // one request to one task
  using TaskCalls = std::map<TaskId, TaskCall>;

  // This client's request numbers (wire.proto: exactly once), shared with
  // the clients WithTimeout makes, which are the same client to a server.
  struct RequestNumbers {
    static uint64_t DrawClientId();
    uint64_t Open();  // the next number, now in flight
    void Close(uint64_t id);  // answered, or given up on
    // Which numbers are settled, into `header` (its first_unfinished_id,
    // known_below_id and unfinished_ids): every number below a bound but
    // those in flight, the lowest kMaxReported of them.
    void Report(wire::RequestHeader* header);
    static constexpr size_t kMaxReported = 64;
    const uint64_t client_id = DrawClientId();
    std::mutex mu;
    uint64_t next = 1;
    std::set<uint64_t> open;
  };

  Client(std::map<TaskId, std::shared_ptr<Channel>> channels, std::shared_ptr<const Placement> placement,
         ClientOptions options, std::shared_ptr<RequestNumbers> numbers = nullptr);
  absl::StatusOr<std::vector<VariablePlacement>> LocateAll(const std::vector<std::string>& names) const;
  // The one task of each named variable; InvalidArgument for a partitioned
  // one (`what` names the operation).
  // The tasks the placement puts variables on.
  std::set<TaskId> VariableTasks() const;
  absl::StatusOr<std::vector<TaskId>> LocateWhole(const std::vector<std::string>& names, absl::string_view what) const;
  // Sends every call in parallel and waits for all, sending again those whose
  // task was unreachable until the deadline; returns the first error.
  // `answer_timeout`, when longer than rpc_timeout, is how long an answer
  // may take once a call is sent (saves, restores).
  absl::Status RunAll(TaskCalls& calls, absl::Duration answer_timeout = absl::ZeroDuration());
  absl::StatusOr<Channel*> ChannelFor(const TaskId& task) const;
  // Reads every shard of the named variables, each request shaped by
  // `configure`, into `calls`; `placements` gets where each variable lives.
  absl::Status ReadShards(const std::vector<std::string>& names,
                          const std::function<void(wire::ReadRequest*)>& configure,
                          std::vector<VariablePlacement>* placements, TaskCalls* calls);
  // The variables' values from answered read calls, partitions put together.
  absl::StatusOr<std::vector<torch::Tensor>> Reassemble(const std::vector<VariablePlacement>& placements,
                                                        TaskCalls& calls) const;
  // One counter request to the counter task; the counter's value after it.
  absl::StatusOr<int64_t> CallCounter(const wire::CounterRequest& request);
  // Applies `updates` by `rule`, bumping `counters`; with `values`, the
  // answers also bring the variables' values right after the apply (an
  // elastic update's: right before it).
  absl::StatusOr<std::vector<int64_t>> Update(wire::UpdateRule rule, const std::vector<std::string>& names,
                                              const std::vector<torch::Tensor>& updates,
                                              const std::vector<CounterDelta>& counters,
                                              std::vector<torch::Tensor>* values = nullptr,
                                              double elastic_alpha = 0,
                                              const wire::DataProgress* progress = nullptr,
                                              wire::ProgressAnswer* answer = nullptr);
  // Adds each variable's tensor, sliced per shard, to the call for the
  // shard's task (and the shard to the call's `pieces`); `add_name` records
  // the shard in that call's header, given the stored name, the variable's
  // index and the slice. `placements` (optional) gets where each lives.
  using AddName = std::function<void(wire::RequestHeader&, const std::string&, size_t, const torch::Tensor&)>;
  absl::Status AddPerShard(const std::vector<std::string>& names, const std::vector<torch::Tensor>& tensors,
                           absl::string_view what, const AddName& add_name, TaskCalls* calls,
                           std::vector<VariablePlacement>* placements = nullptr) const;

  std::map<TaskId, std::shared_ptr<Channel>> channels_;
  std::shared_ptr<const Placement> placement_;
  ClientOptions options_;
  std::atomic<int64_t> requests_sent_{0};
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
  std::atomic<int64_t> tensor_bytes_sent_{0};
  std::atomic<int64_t> restarts_seen_{0};
  std::atomic<int64_t> retries_{0};
  std::shared_ptr<RequestNumbers> numbers_;
  absl::Mutex incarnation_mu_;
  std::map<TaskId, uint64_t> incarnations_ ABSL_GUARDED_BY(incarnation_mu_);
};

}  // namespace shoal

#endif  // SHOAL_CLIENT_CLIENT_H_
