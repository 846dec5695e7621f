// AsyncStrategy: asynchronous parameter-server training (Downpour/Hogwild,
// TensorFlow's between-graph replication without SyncReplicasOptimizer).
//
// Each step a worker pulls every variable (no lock: it may see another
// worker's update half applied), computes gradients on its own batch with
// libtorch autograd, and pushes them with a global_step increment; each
// server applies them with the variable's optimizer as they arrive.
#ifndef SHOAL_STRATEGY_ASYNC_STRATEGY_H_
#define SHOAL_STRATEGY_ASYNC_STRATEGY_H_

#include "shoal/strategy/strategy.h"
#include "shoal/strategy/training_mode.h"

namespace shoal {

class AsyncStrategy final : public TrainingStrategy {
 public:
  absl::StatusOr<WorkerResult> RunWorker(WorkerContext& context) override;
};

// The mode "async" (training_mode.h).
const TrainingMode& AsyncMode();

}  // namespace shoal

#endif  // SHOAL_STRATEGY_ASYNC_STRATEGY_H_
