// TrainingStrategy: what a worker does each step. One implementation per
// training mode (async now; sync, local replicas, populations and the gated
// ensemble stand beside it), all on the same Client.
#ifndef SHOAL_STRATEGY_STRATEGY_H_
#define SHOAL_STRATEGY_STRATEGY_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "shoal/client/client.h"
#include "shoal/data/dataset.h"
#include "shoal/model/mlp.h"
#include "shoal/session/config.h"

namespace shoal {

// Names of the counters every strategy keeps on the counter task.
inline constexpr char kGlobalStep[] = "global_step";
inline constexpr char kWorkersDone[] = "workers_done";
inline constexpr char kStaleGradients[] = "stale_gradients_dropped";
inline constexpr char kJobAborted[] = "job_aborted";

// Called after each step a worker finishes (from that worker's thread).
using StepCallback = std::function<void(int64_t global_step, double loss)>;

// What one worker's training loop works with. Nothing here is owned.
struct WorkerContext {
  TaskId task;
  int worker_index = 0;  // among the training tasks
  int num_workers = 1;
  std::vector<TaskId> workers;  // every training task, by worker index
  bool is_chief = false;
  Client* client = nullptr;
  const JobConfig* config = nullptr;
  Dataset train_shard;
  int64_t max_steps = 0;  // global steps to train for
  StepCallback on_step;   // may be empty
  // Runs before each local step (may be empty): a place for hooks, and for
  // tests that slow one worker down.
  std::function<void(int64_t local_step)> before_step;
};

struct WorkerResult {
  int64_t local_steps = 0;
  double last_loss = 0;
};

// Counters of the SSP clock gaps seen: "ssp_gap/<g>" counts steps that began
// g steps ahead of the slowest worker.
std::string SspGapCounter(int64_t gap);

class TrainingStrategy {
 public:
  virtual ~TrainingStrategy() = default;
  // Runs one worker until the job's global step reaches max_steps.
  virtual absl::StatusOr<WorkerResult> RunWorker(WorkerContext& context) = 0;
};

// The strategy for `config.training.mode`.
absl::StatusOr<std::unique_ptr<TrainingStrategy>> MakeStrategy(const JobConfig& config);

// Gradients averaged per synchronous step: the configured number, or all workers.
int ReplicasToAggregate(const JobConfig& config, int num_workers);

// Examples one global step consumes: a batch, or one from each aggregated replica.
int64_t ExamplesPerStep(const JobConfig& config, int num_workers);

// Global steps for `config` over a training set of `train_examples`: one
// batch per step when asynchronous, one batch from each aggregated replica
// per step when synchronous.
int64_t MaxSteps(const JobConfig& config, int64_t train_examples, int num_workers);

// One worker step's local half: pulls `model`'s variables into it and runs
// forward and backward on the next batch. Returns the loss; the gradients are
// then in model.Gradients().
absl::StatusOr<double> PullAndComputeGradients(Client& client, Mlp& model, BatchIterator& batches);

// The chief creates the model's variables (initial values from the seeded
// model); every other worker waits for them, up to the start-up timeout.
absl::Status InitializeOrWait(WorkerContext& context, const Mlp& model);

}  // namespace shoal

#endif  // SHOAL_STRATEGY_STRATEGY_H_
