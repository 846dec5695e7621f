// SspStrategy: stale synchronous parallel (Ho et al. 2013; the bounded
// delay of ps-lite and MXNet's kvstore requests).
//
// Updates are applied as they arrive, as in async mode, but a worker may be
// at most `staleness` steps ahead of the slowest worker: before its step c it
// waits until every worker has finished step c - s - 1. s = 0 is
// bulk-synchronous, a negative s never waits (async). Every worker runs the
// same number of local steps (max_steps / workers), so no one waits for a
// worker that has already stopped.
//
// Each step records its clock gap (c minus the slowest worker's finished
// steps, read from per-worker clock counters, independently of the wait) in
// the counters "ssp_gap/<g>", so the bound can be checked after the fact.
#ifndef SHOAL_STRATEGY_SSP_STRATEGY_H_
#define SHOAL_STRATEGY_SSP_STRATEGY_H_

#include "shoal/strategy/strategy.h"
#include "shoal/strategy/training_mode.h"

namespace shoal {

class SspStrategy final : public TrainingStrategy {
 public:
  absl::StatusOr<WorkerResult> RunWorker(WorkerContext& context) override;
};

// The mode "ssp" (training_mode.h).
const TrainingMode& SspMode();

}  // namespace shoal

#endif  // SHOAL_STRATEGY_SSP_STRATEGY_H_
