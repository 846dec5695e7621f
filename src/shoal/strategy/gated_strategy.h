// Gated ensemble (mode gated): K worker networks trained in lockstep on the
// same batches, each one's gradient step scaled by a master network's weight
// for it (model/gated_ensemble.h has the formulas).
//
// With one worker per network, network k trains on worker task k and the
// master on the chief (which also trains network 0). Each step:
//   1. the chief picks the batch and publishes its example indices;
//   2. every worker task computes its network's logits on that batch and
//      sends them to the chief;
//   3. the chief runs the master, applies the master's gradient, and sends
//      each network its scales (and, with master_loss_to_workers, the master
//      loss's gradient with respect to its logits);
//   4. every worker task applies its network's scaled gradient through the
//      ps; a shared trunk's gradients are summed on the ps (SUM_GRADIENT
//      accumulators) and applied by the chief before the next batch.
// The exchange tensors live on the chief (exchange/...) and counters on the
// counter task pace the steps; every wait has the sync deadline and names the
// task it waited for.
//
// With one worker the whole ensemble trains in that task, in one graph
// (GatedEnsemble::OneGraphStep). Both forms see the same batches and reach
// the same parameters.
#ifndef SHOAL_STRATEGY_GATED_STRATEGY_H_
#define SHOAL_STRATEGY_GATED_STRATEGY_H_

#include "shoal/strategy/train_report.h"
#include "shoal/strategy/strategy.h"
#include "shoal/strategy/training_mode.h"

namespace shoal {

// The ensemble's variables and the exchange tensors, for the placement, and
// the scope rule that puts the exchange on the chief.
absl::StatusOr<std::vector<VariableSpec>> GatedVariableSpecs(const StrategyConfig& config, int num_workers);
ScopeRule GatedExchangeRule(const TaskId& chief);

// The chief's batches, as [n, 1] float rows of example indices (and their
// labels): the same sequence in every form of the job.
BatchIterator GatedBatchIndices(const Dataset& train, const StrategyConfig& config);

class GatedStrategy : public TrainingStrategy {
 public:
  absl::StatusOr<WorkerResult> RunWorker(WorkerContext& context) override;
};

// The chief's report: the test accuracy of the master-weighted vote (the
// job's), of every network alone and of their uniform average.
absl::Status ReportGated(WorkerContext& context, const Dataset& test_set, TrainReport* report);

// The mode "gated" (training_mode.h).
const TrainingMode& GatedMode();

}  // namespace shoal

#endif  // SHOAL_STRATEGY_GATED_STRATEGY_H_
