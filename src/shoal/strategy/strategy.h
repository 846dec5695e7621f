// TrainingStrategy: what a worker does to train, one per training mode
// (training_mode.h lists them), and the toolkit they share on the same
// Client: the worker's context, initialising or waiting for the variables,
// computing a step, the hooks' checks, buffers, recovering from a lost ps,
// and the waits of synchronous exchanges.
#ifndef SHOAL_STRATEGY_STRATEGY_H_
#define SHOAL_STRATEGY_STRATEGY_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/client/client.h"
#include "shoal/data/dataset.h"
#include "shoal/hooks/hook.h"
#include "shoal/model/mlp.h"
#include "shoal/model/row_tables.h"
#include "shoal/strategy/strategy_config.h"
#include "shoal/telemetry/prometheus_metrics.h"
#include "shoal/telemetry/trace.h"

namespace shoal {

// Names of the counters every strategy keeps on the counter task (and
// kGlobalStep, checkpoint/checkpoint.h).
inline constexpr char kWorkersDone[] = "workers_done";
inline constexpr char kStaleGradients[] = "stale_gradients_dropped";
inline constexpr char kJobAborted[] = "job_aborted";
// Checkpoints restored onto the job so far: at start, after a lost ps task,
// and by each population member that restored its own.
inline constexpr char kRestores[] = "restores";
// 1 while the chief restores a checkpoint onto the job (workers wait for it
// to finish before they read the restored values), 0 otherwise.
inline constexpr char kRestoreInProgress[] = "restore_in_progress";
// The global step of the checkpoint the job was last restored to.
inline constexpr char kRestoredStep[] = "restored_step";
// Above 0 once a hook on any worker stopped the job: every worker ends cleanly
// at its next exchange with the ps.
inline constexpr char kStopRequested[] = "stop_requested";

// The fingerprint (DataFingerprint) of the training set the job's places in
// it (DataPositionCounter) are for; kept with them in checkpoints.
inline constexpr char kDataFingerprint[] = "data_fingerprint";
// The global step at which the job began on its current training set: 0,
// or the step of the checkpoint a job over other data started from. Modes
// that draw a batch a global step (the gated ensemble) seek to the batch of
// their step less this one. Kept in checkpoints.
inline constexpr char kDataStartStep[] = "data_start_step";

// How far worker `worker_index` of `num_workers` has read its shard of the
// training set: the examples it drew for the steps it sent, over every epoch
// (BatchIterator::examples_drawn). Kept on the counter task and saved with
// checkpoints, so that a restarted worker, a job rewound to a checkpoint
// and a job started again over one read on from there, not from the
// shard's start: one pass over a click log stays one pass. Named by the
// worker count, since another count shards the data otherwise.
std::string DataPositionCounter(int worker_index, int num_workers);

class LeasedData;  // strategy/leased_data.h

// Called after each step a worker finishes (from that worker's thread);
// `auc` is the batch's for a click model, else -1.
using StepCallback = std::function<void(int64_t global_step, double loss, double auc)>;

// WorkerContext::max_steps of a job that ends when its data is over: the
// steps a job on leased data makes depend on who trained (a sync step takes
// the gradients of the workers live then), so only the data can say.
inline constexpr int64_t kNoStepLimit = int64_t{1} << 60;

// What one worker's training loop works with. Nothing here is owned.
struct WorkerContext {
  TaskId task;
  absl::Time started = absl::Now();  // when the task began (a joining worker's time to its first update)
  int worker_index = 0;  // among the training tasks
  int num_workers = 1;
  std::vector<TaskId> workers;  // every training task, by worker index
  bool is_chief = false;
  Client* client = nullptr;
  const StrategyConfig* config = nullptr;
  Dataset train_shard;
  Dataset validation;          // populations: carved from the training set, never trained on
  int64_t train_examples = 0;  // in the whole training set (for epochs)
  int64_t data_fingerprint = 0;  // DataFingerprint of the whole training set
  // Global steps to train for; kNoStepLimit on leased data, where the lease
  // table ends the job once it has handed out `leases.epochs` epochs.
  int64_t max_steps = 0;
  StepCallback on_step;   // may be empty
  // Runs before each local step (may be empty): tests slow a worker down with it.
  std::function<void(int64_t local_step)> before_step;
  HookList* hooks = nullptr;  // set by the session from the config; may be null
  // The client's traffic when start-up (creating or waiting for the
  // variables) was over, so that reports count training traffic only.
  int64_t startup_bytes_sent = 0;
  int64_t startup_bytes_received = 0;
  int64_t startup_tensor_bytes_sent = 0;
  // The checkpoint the chief restored at start-up (empty if none) and its
  // global step, where this session's training began.
  std::string restored_from;
  int64_t restored_step = 0;
  // The chief's restores after a task lost its variables mid-job.
  std::vector<std::string> recoveries;
  // Set by a strategy that trains through the accumulators (sync counts
  // global steps in them): called by a restore to `global_step`, it puts the
  // strategy's own counters back and returns the step every accumulator
  // restarts at, emptied. Unset: accumulators are left as they are.
  std::function<absl::StatusOr<int64_t>(int64_t global_step)> restore_accumulator_step;
  // What this worker knew of the job when it last (re)joined: the restores
  // counter and the task restarts its client had seen. A change in either
  // while it waits means the job went back to a checkpoint (JobRewound).
  int64_t restores_known = 0;
  int64_t restarts_known = 0;
  // Hooks run after the configured ones (tests, programs embedding shoal).
  std::vector<std::shared_ptr<TrainingHook>> extra_hooks;
  // The model's buffers (BatchNorm statistics) and their initial values,
  // noted by InitializeOrWait: created beside the variables, restored with
  // them, and shared by the mode's rule (ShareBuffers).
  std::vector<std::string> buffer_names;
  std::vector<torch::Tensor> buffer_values;
  // The model's embedding tables (CreateRowTables), which a restore creates
  // again on a restarted ps task before it restores their rows.
  std::vector<wire::TableDef> table_defs;
  // Leased data (data.leases; LeasedData): the whole training set, and the
  // places the step's batch came from, which the mode's push carries to
  // every task (null: not leased), and the tasks' answer to it.
  struct Leases {
    bool enabled = false;
    int64_t shard_examples = 0;
    absl::Duration timeout = absl::Seconds(10);
    int64_t epochs = 0;  // the job ends when the lease table has finished these (0: at max_steps)
  } leases;
  Dataset train_set;
  // Set by the step driver: the session hands its lease back and leaves the
  // live count once this worker's last counters are in (LeasedData::Leave).
  std::shared_ptr<LeasedData> leased_data;
  // Leased data: once this is set (a worker's SIGTERM), the worker leaves
  // after its step, alone; the job trains on. May be null.
  const std::atomic<int>* leave_requested = nullptr;
  const wire::DataProgress* step_progress = nullptr;
  wire::ProgressAnswer step_answer;
  // Examples this worker drew since it last added them to its
  // DataPositionCounter: its mode's next exchange with the counter task
  // carries them (TakeDataPosition).
  int64_t unpublished_examples = 0;
  // Watching (telemetry/), when the job asks: the trace and the process's
  // Prometheus endpoint. Null: off.
  Tracer* tracer = nullptr;
  MetricsEndpoint* metrics_endpoint = nullptr;
  // Set by the step driver (async, sync, ssp): the chief publishes its
  // buffers every training.buffer_publish_steps steps (PublishChiefBuffers).
  bool chief_publishes_buffers = false;
};

struct WorkerResult {
  int64_t local_steps = 0;
  double last_loss = 0;
  std::string stop_reason;  // set when a hook of this worker stopped the job
  RowTables::CacheStats row_cache;  // a model with row tables: its cache's figures
  std::vector<std::string> tables;  // ... and their names
  int64_t leases_taken = 0;         // leased data: shards this worker leased, and lost to others
  int64_t leases_lost = 0;
};

// The counter delta that adds the examples drawn since the last one to this
// worker's DataPositionCounter (0 when none were), for its mode's next
// counter request; they count as published from now on.
CounterDelta TakeDataPosition(WorkerContext& context);

// Where this worker's data stands for the job (its DataPositionCounter): the
// examples of its steps the ps took in. A negative count is data loss.
absl::StatusOr<int64_t> ReadDataPosition(WorkerContext& context);

// Counters of the SSP clock gaps seen: "ssp_gap/<g>" counts steps that began
// g steps ahead of the slowest worker.
std::string SspGapCounter(int64_t gap);

class TrainingStrategy {
 public:
  virtual ~TrainingStrategy() = default;
  // Runs one worker until the job's global step reaches max_steps.
  virtual absl::StatusOr<WorkerResult> RunWorker(WorkerContext& context) = 0;
};

// Gradients averaged per synchronous step: the configured number, or all workers.
int ReplicasToAggregate(const StrategyConfig& config, int num_workers);

// What forward and backward on one batch gave.
struct BatchResult {
  double loss = 0;
  double accuracy = 0;
  double auc = -1;  // clicks: the batch's AUC (-1: not clicks, or one class only)
  int64_t examples = 0;
};

// Forward and backward on the next batch, or on `input` (whose rows a model
// with row tables has pulled); the gradients are then in model.Gradients()
// (and on the pulled rows).
BatchResult ComputeGradients(Model& model, BatchIterator& batches);
BatchResult ComputeGradients(Model& model, const torch::Tensor& input, const torch::Tensor& labels);

// Reads the model's variables from the ps into it: a step's pull.
absl::Status PullVariables(Client& client, Model& model);

// A step's pull where the last push may have brought the values back
// (Client::ApplyGradientsAndRead): loads those, leaving `pushed_values`
// empty, or else pulls (PullVariables).
absl::Status PullUnlessPushed(Client& client, Model& model, std::vector<torch::Tensor>* pushed_values);

// Reads the model's variables and buffers from the ps (one call) into it:
// what evaluation and the local-replica modes' fetch use.
absl::Status PullVariablesAndBuffers(Client& client, Model& model);

// A StepInfo for the hooks.
StepInfo MakeStepInfo(int64_t local_step, int64_t global_step, const BatchResult& batch, const Model& model);

// How a mode shares the model's buffers (none for a model without):
//   async, sync, ssp: the chief publishes its own every
//     training.buffer_publish_steps local steps and at its last step;
//     evaluation uses the published ones;
//   local replicas: at every exchange each worker adds its drift (how far
//     its buffers moved since it last pulled or pushed them) to the ps's
//     copy, divided by the number of workers for float buffers, and pulls
//     the result with the variables; at a model-averaging barrier that is
//     the replicas' mean, int64 counts summed.
//   gated: each task publishes the buffers of the networks it trains (and
//     the chief the master's) on the same schedule.
// The first rule, run from FinishStep (a no-op for the others).
absl::Status PublishChiefBuffers(WorkerContext& context, const StepInfo& step);
// Assigns `names` what `values` gives (nothing for no names) when buffers
// are due after `step`: every training.buffer_publish_steps local steps,
// and at the job's last step.
absl::Status PublishBuffersIfDue(WorkerContext& context, const StepInfo& step, const std::vector<std::string>& names,
                                 const std::function<std::vector<torch::Tensor>()>& values);

// Runs the worker's hooks on `update` before it is sent. Returns false when a
// hook stopped training: the caller must not send it, and should return.
// (The job has been told to stop; the reason is in `result`.)
absl::StatusOr<bool> CheckUpdate(WorkerContext& context, const std::vector<std::string>& names,
                                 const std::vector<torch::Tensor>& update, const StepInfo& step,
                                 WorkerResult* result);

// After a local step: counts it in `result`, reports progress and runs the
// hooks. Returns false when a hook stopped training (the job has been told).
absl::StatusOr<bool> FinishStep(WorkerContext& context, StepInfo& step, WorkerResult* result);

// Whether some worker has stopped the job.
absl::StatusOr<bool> JobStopRequested(Client& client);

// The chief creates the model's variables (initial values from the seeded
// model), trained on the ps by `optimizer` (default: training.optimizer);
// every other worker waits for them, up to the start-up timeout.
//
// First, one forward pass on two training examples checks that the model
// fits the data (InvalidArgument naming the model and the shapes).
absl::Status InitializeOrWait(WorkerContext& context, Model& model,
                              const wire::OptimizerConfig* optimizer = nullptr);

// Reads the job's buffers (BatchNorm statistics) from the ps into `model`,
// on joining the job and after a restore: a chief that publishes its own
// must go on from the job's, which a restore may have brought back, not
// from fresh statistics.
absl::Status LoadJobBuffers(WorkerContext& context, Model& model);

// Binds a model's row tables (none: nothing to do) to the worker's client;
// the chief creates them on the ps tasks (creating one that exists changes
// nothing), the others wait until every ps task holds them and no restore
// is in progress: at start-up, and again on rejoining after a lost ps task.
// A checkpoint restore (at start-up or after a lost ps) brings their rows
// back.
absl::Status CreateRowTables(WorkerContext& context, Model& model);

// Whether a step that failed with `error` may recover: the job keeps
// checkpoints, and a task was unreachable, did not answer in time (a network
// partition) or had lost its variables (a ps task killed, and perhaps
// restarted empty).
bool Recoverable(const WorkerContext& context, const absl::Status& error);

// After a recoverable failure: the chief waits until every task answers
// and, if some lack their variables or tables, restores the newest
// checkpoint onto all of them (values, slots, table rows, global_step: the
// whole job goes back to it, so that no task serves fresh initial values);
// the others wait until the variables exist again. Up to the start-up timeout; then `error`, with what
// was waited for.
absl::Status RecoverLostVariables(WorkerContext& context, const std::vector<std::string>& names,
                                  const std::vector<torch::Tensor>& shapes_from,
                                  const wire::OptimizerConfig& optimizer, const absl::Status& error);

// Notes what the worker now knows of the job (restores_known,
// restarts_known): at the start of training and after each rejoin.
absl::Status NoteJobState(WorkerContext& context);

// Unavailable when the job was restored from a checkpoint, or a task
// restarted, since the worker last noted the job's state: a worker waiting
// for the others at a barrier, or for a round or step that the restore undid,
// must give up and rejoin (StepUntilDone does) rather than wait for ever.
absl::Status JobRewound(WorkerContext& context);

// Whether every variable `exist` (VariablesExist's answer) names is there.
bool AllExist(const std::vector<bool>& exist);

// The checkpoint to restore at start: the newest under checkpoint.dir,
// unless the tasks still hold every one of `names` and checkpoint.restore is
// if_lost (a restarted task then goes on from their live values, which are
// newer). Empty when there is none.
absl::StatusOr<std::string> CheckpointToRestore(WorkerContext& context, const std::vector<std::string>& names);

// After a recoverable `error`: waits (up to the start-up timeout) until every
// task holding `names` answers, and says which of them exist; then `error`,
// with what was waited for.
absl::StatusOr<std::vector<bool>> VariablesOnceAnswered(WorkerContext& context, const std::vector<std::string>& names,
                                                        const absl::Status& error);

// The newest checkpoint under checkpoint.dir, to recover from, marked in
// use while the result lives (a save ending in the background must not
// prune it); else `error` saying why there is none.
absl::StatusOr<std::unique_ptr<CheckpointInUse>> CheckpointToRecoverFrom(const WorkerContext& context,
                                                                         const absl::Status& error);

// Puts back the job's counters as `index` saved them where the counter task
// has fewer (it was lost): they only grow, so the larger value is the truer
// one.
absl::Status RestoreSavedCounters(Client& client, const CheckpointIndex& index);

// The chief of a job started again over the checkpoint `index`: its data
// fingerprint, the step its data began at (kDataStartStep) and its
// workers' places in the data (DataPositionCounter) as saved. A checkpoint of another worker count has none for this one: this
// count's places start at 0, and the chief says so.
absl::Status RestoreDataPositions(WorkerContext& context, const CheckpointIndex& index);

// Where worker `worker_index` of this job stood in its data when `index` was
// saved: 0 where the checkpoint keeps no place for it (another worker count,
// an older checkpoint) or kept it for other data. For modes in which each
// part of the job restores its own workers' places (a population member's lead).
int64_t KeptDataPosition(const WorkerContext& context, const CheckpointIndex& index, int worker_index);

// The chief, starting the job before any worker reads its place: keeps the
// places (live, or restored just before) when they are for this training
// set (context.data_fingerprint); otherwise, other data (the next day's
// log), puts every worker's place at its shard's start, saying so, and
// notes the global step now as where this data began (kDataStartStep).
absl::Status MatchDataPositions(WorkerContext& context);

// A training loop: runs `step` until it returns false; after a failure that
// is Recoverable, `recover` (the strategy's way back) and on; any other
// failure, or one of `recover`'s, ends the loop.
absl::Status StepUntilDone(WorkerContext& context, const std::function<absl::StatusOr<bool>()>& step,
                           const std::function<absl::Status(const absl::Status& error)>& recover);

// A worker's training loop: runs `step` until it returns false. A failure
// that is Recoverable is recovered from (RecoverLostVariables, for the
// variables `names` shaped as `shapes_from`, created with `optimizer`), the
// job's state is noted again (NoteJobState), and `rejoin` (re-reading what
// the worker keeps of the job) runs before the next step; any other failure
// ends the loop.
absl::Status StepUntilDone(WorkerContext& context, const std::vector<std::string>& names,
                           const std::vector<torch::Tensor>& shapes_from, const wire::OptimizerConfig& optimizer,
                           const std::function<absl::StatusOr<bool>()>& step,
                           const std::function<absl::Status()>& rejoin);

// Waits until counter `name` reaches `target`, polling, or the job is stopped
// or aborted, or `timeout` runs out; `what` names the wait in errors, and
// `completer` the task that should have moved the counter (default: the
// chief). Returns the counter's value, or 0 when the job was stopped.
absl::StatusOr<int64_t> WaitForCounter(WorkerContext& context, const std::string& name, int64_t target,
                                       absl::Duration timeout, const std::string& what,
                                       const TaskId* completer = nullptr);

// The chief creates `names` with initial `values`, trained on the ps by
// `optimizer`; every other worker waits for them (InitializeOrWait's core).
absl::Status InitializeOrWait(WorkerContext& context, const std::vector<std::string>& names,
                              const std::vector<torch::Tensor>& values, const wire::OptimizerConfig& optimizer);

// The chief's side of a synchronous exchange (Client::ApplyAccumulated with
// every worker named), which gives up early when the job is stopped: returns
// false then. On failure it aborts the job so the other workers do not wait.
// With `replicas_now` (leased data: LeasedData::AskLiveWorkers, which also
// renews the lease held), the count it waits for is asked again between
// short tries.
absl::StatusOr<bool> ApplyAccumulatedOrStop(WorkerContext& context, const std::vector<std::string>& names,
                                            int replicas, int64_t new_step, wire::AccumulatedRule rule,
                                            const std::function<absl::StatusOr<int>()>& replicas_now = nullptr);

// Every worker's end of a synchronous step whose accumulators apply
// themselves (Accumulate with apply_at): the values of step `min_step` once
// the servers have applied it (Client::ReadAtStep), polled in short waits so
// that a stop is seen; not ready means the job was stopped. After
// sync_timeout_s, DeadlineExceeded naming the workers whose gradients did not
// arrive, and the job is aborted so the others stop too.
// A restore rewinds a step in progress: when the accumulators are found
// below `min_step - 1` (a checkpoint put them back), `rewound` is set and
// nothing is waited for. While waiting, `resend` (if set) sends this
// worker's gradient again every second: an accumulator that a restore
// emptied takes it, one that has it already drops the repeat.
struct StepWait {
  Client::StepValues values;
  bool rewound = false;
};
absl::StatusOr<StepWait> ReadAtStepOrStop(WorkerContext& context, const std::vector<std::string>& names,
                                          int64_t min_step, int replicas,
                                          const std::function<absl::Status()>& resend = nullptr);

}  // namespace shoal

#endif  // SHOAL_STRATEGY_STRATEGY_H_
