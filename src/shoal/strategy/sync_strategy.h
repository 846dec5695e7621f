// SyncStrategy: synchronous training with TensorFlow's SyncReplicasOptimizer
// semantics.
//
// Each step every worker reads the variables, computes gradients on its own
// batch and sends them, tagged with its local step, to the variables'
// accumulators. The chief waits until each accumulator holds R =
// replicas_to_aggregate gradients, has every server apply the average with
// the variable's optimizer, and advances global_step: the barrier. A worker's
// next step starts only once global_step has moved past its local step, and
// then takes the new global step as its local step, so every worker reads the
// same, latest values.
//
// Backup workers: with N workers and R < N, a step completes on the first R
// gradients; a straggler's late gradient is older than the accumulator's step
// and is dropped (counted in stale_gradients_dropped), and the straggler
// continues from the new values. R > N is refused: one worker never
// contributes several gradients to a step.
//
// No hang: a step that cannot gather R gradients within sync_timeout_s fails
// on the chief, naming the workers it did not hear from, and the chief marks
// the job aborted so the other workers stop too; a worker whose chief is gone
// fails after the same timeout.
#ifndef SHOAL_STRATEGY_SYNC_STRATEGY_H_
#define SHOAL_STRATEGY_SYNC_STRATEGY_H_

#include "shoal/strategy/strategy.h"

namespace shoal {

class SyncStrategy final : public TrainingStrategy {
 public:
  absl::StatusOr<WorkerResult> RunWorker(WorkerContext& context) override;
};

}  // namespace shoal

#endif  // SHOAL_STRATEGY_SYNC_STRATEGY_H_
