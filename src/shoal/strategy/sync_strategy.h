// SyncStrategy: synchronous training with TensorFlow's SyncReplicasOptimizer
// semantics.
//
// Each step every worker computes gradients on its own batch from the same
// values and sends them, tagged with its local step, to the variables'
// accumulators. The gradient that brings an accumulator to R =
// replicas_to_aggregate makes its server apply the mean with the variable's
// optimizer and move the accumulator to the next step, right there: the
// values SyncReplicas' chief would apply, without a round trip through it.
// The barrier: a worker's next step starts only once every accumulator has
// reached it; one call (Client::ReadAtStep) waits for that and pulls the new
// values, so every worker reads the same, latest values. The chief keeps
// global_step equal to the steps applied.
//
// Backup workers: with N workers and R < N, a step completes on the first R
// gradients; a straggler's late gradient is older than the accumulator's step
// and is dropped (counted in stale_gradients_dropped), and the straggler
// continues from the new values. R > N is refused: one worker never
// contributes several gradients to a step.
//
// No hang: a worker whose step cannot gather R gradients within
// sync_timeout_s fails, naming the workers it did not hear from, and marks
// the job aborted so the other workers stop too.
#ifndef SHOAL_STRATEGY_SYNC_STRATEGY_H_
#define SHOAL_STRATEGY_SYNC_STRATEGY_H_

#include "shoal/strategy/strategy.h"
#include "shoal/strategy/training_mode.h"

namespace shoal {

class SyncStrategy final : public TrainingStrategy {
 public:
  absl::StatusOr<WorkerResult> RunWorker(WorkerContext& context) override;
};

// The mode "sync" (training_mode.h).
const TrainingMode& SyncMode();

}  // namespace shoal

#endif  // SHOAL_STRATEGY_SYNC_STRATEGY_H_
