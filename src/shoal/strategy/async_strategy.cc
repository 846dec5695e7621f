#include "shoal/strategy/async_strategy.h"

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"

namespace shoal {

absl::StatusOr<WorkerResult> AsyncStrategy::RunWorker(WorkerContext& context) {
  const JobConfig& config = *context.config;
  Mlp model(config.model);
  SHOAL_RETURN_IF_ERROR(InitializeOrWait(context, model));
  const std::vector<std::string>& names = model.variable_names();
  BatchIterator batches(context.train_shard, config.training.batch_size,
                        config.training.seed * 1000003 + context.worker_index);
  WorkerResult result;
  while (true) {
    SHOAL_ASSIGN_OR_RETURN(double loss, PullAndComputeGradients(*context.client, model, batches));
    SHOAL_ASSIGN_OR_RETURN(std::vector<int64_t> counters,
                           context.client->ApplyGradients(names, model.Gradients(), {{kGlobalStep, 1}}));
    ++result.local_steps;
    result.last_loss = loss;
    if (context.on_step) context.on_step(counters[0], result.last_loss);
    if (counters[0] >= context.max_steps) break;
  }
  return result;
}

}  // namespace shoal
