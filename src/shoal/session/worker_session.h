// The life of one training task, whatever the transport: run the strategy,
// report done, and (on the chief) wait for the other workers, then evaluate
// the trained variables on the test set.
#ifndef SHOAL_SESSION_WORKER_SESSION_H_
#define SHOAL_SESSION_WORKER_SESSION_H_

#include "shoal/config/config.h"
#include "shoal/strategy/strategy.h"
#include "shoal/strategy/train_report.h"

namespace shoal {

// Global steps left out of steady_examples_per_second, as benchmark peers
// leave out their warm-up.
inline constexpr int64_t kWarmupSteps = 50;

// Runs `context`'s worker to the end, with the hooks `hooks` asks for (plus
// context.extra_hooks). On the chief, also waits (with the RPC deadline) for
// every worker to finish and fills `report` with the test accuracy of the
// final variables; `test_set` is only read on the chief.
absl::Status RunWorkerSession(WorkerContext& context, const HooksConfig& hooks, const Dataset& test_set,
                              TrainReport* report);

// Train and test sets as the config asks (subsets when limits are set).
struct DataSplits {
  Dataset train;
  Dataset test;
};
absl::StatusOr<DataSplits> LoadData(const JobConfig& config);

}  // namespace shoal

#endif  // SHOAL_SESSION_WORKER_SESSION_H_
