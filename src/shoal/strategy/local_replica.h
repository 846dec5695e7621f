// What the DistBelief-style strategies (Downpour, model averaging, elastic
// averaging) share: each worker trains its own copy of the model with a
// local optimizer, and exchanges with the ps only now and then.
#ifndef SHOAL_STRATEGY_LOCAL_REPLICA_H_
#define SHOAL_STRATEGY_LOCAL_REPLICA_H_

#include <memory>
#include <vector>

#include "shoal/server/optimizer.h"
#include "shoal/strategy/strategy.h"
#include "shoal/strategy/training_mode.h"

namespace shoal {

// A worker's local copy of the model and the optimizer that trains it, with
// its slots. The copy owns its memory: it never aliases a server's.
class LocalReplica {
 public:
  static absl::StatusOr<std::unique_ptr<LocalReplica>> Create(const ModelConfig& model,
                                                              const wire::OptimizerConfig& optimizer);

  Model& model() { return *model_; }
  const std::vector<std::string>& names() const { return model_->variable_names(); }

  // Copies `values` into the local copy.
  void Load(const std::vector<torch::Tensor>& values) { model_->Load(values); }
  // Snapshots of the local values.
  std::vector<torch::Tensor> Values() const;
  // One local optimizer step with `gradients`.
  void Apply(const std::vector<torch::Tensor>& gradients);

  // The buffers' drift since they were last pulled or pushed (Settle): what
  // this replica adds to the ps's copy, divided by `workers` for float
  // buffers (so that W replicas' drifts from one start add up to their
  // mean) and whole for int64 counts (which add up to the job's total).
  std::vector<torch::Tensor> BufferDrift(int workers) const;
  // The buffers as they are now become the drift's baseline.
  void SettleBuffers() { settled_buffers_ = model_->BufferValues(); }
  // Takes the ps's buffers (a fetch's) and settles them: drift counts from here.
  void TakeGlobalBuffers(const std::vector<torch::Tensor>& buffers) {
    model_->LoadBuffers(buffers);
    SettleBuffers();
  }

 private:
  LocalReplica(std::unique_ptr<Model> model, std::shared_ptr<const Optimizer> optimizer);

  std::unique_ptr<Model> model_;
  std::shared_ptr<const Optimizer> optimizer_;
  std::vector<OptimizerSlots> slots_;
  std::vector<torch::Tensor> settled_buffers_;
};

// Loads the global copy, buffers included, into `replica`: what a worker
// does at start and after every averaging (a restarted worker rejoins the
// same way).
absl::Status FetchGlobal(Client& client, LocalReplica& replica);

// The local-replica buffer rule (see PublishChiefBuffers): adds the
// replica's buffer drift to the ps's copy and settles it. With
// `buffers_after`, the same call brings the ps's buffers back as they are
// right after the add (a fetch of them with no round trip of its own). A
// no-op for a model without buffers.
absl::Status PushBufferDrift(WorkerContext& context, LocalReplica& replica,
                             std::vector<torch::Tensor>* buffers_after = nullptr);

class DownpourStrategy : public TrainingStrategy {
 public:
  absl::StatusOr<WorkerResult> RunWorker(WorkerContext& context) override;
};

class ModelAverageStrategy : public TrainingStrategy {
 public:
  absl::StatusOr<WorkerResult> RunWorker(WorkerContext& context) override;
};

class ElasticAverageStrategy : public TrainingStrategy {
 public:
  absl::StatusOr<WorkerResult> RunWorker(WorkerContext& context) override;
};

// Model averaging's schedule: exchange r (from 0) follows this many local
// steps (1 during warm-up, then interval_steps); and the number of exchanges
// that covers a worker's share of `max_steps`.
int64_t LocalStepsInRound(const LocalReplicaConfig& config, int64_t round);
int64_t AveragingRounds(const LocalReplicaConfig& config, int64_t max_steps, int num_workers);
// The round in progress after `local_step` local steps: the one that starts
// there (a restored checkpoint's step, per worker), or holds it.
int64_t RoundAtLocalStep(const LocalReplicaConfig& config, int64_t local_step);

// Counts the averaging exchanges completed.
inline constexpr char kAverageRound[] = "average_round";

// The modes "downpour", "model_average" and "easgd" (training_mode.h).
const TrainingMode& DownpourMode();
const TrainingMode& ModelAverageMode();
const TrainingMode& ElasticAverageMode();

}  // namespace shoal

#endif  // SHOAL_STRATEGY_LOCAL_REPLICA_H_
