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
  torch::Tensor images, labels;
  while (true) {
    SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> values, context.client->Read(names));
    model.Load(values);
    batches.Next(&images, &labels);
    for (const auto& p : model.variables()) p.mutable_grad().reset();
    torch::Tensor loss = CrossEntropyLoss(model.Forward(images), labels);
    loss.backward();
    SHOAL_ASSIGN_OR_RETURN(std::vector<int64_t> counters,
                           context.client->ApplyGradients(names, model.Gradients(), {{kGlobalStep, 1}}));
    ++result.local_steps;
    result.last_loss = loss.item<double>();
    if (context.on_step) context.on_step(counters[0], result.last_loss);
    if (counters[0] >= context.max_steps) break;
  }
  return result;
}

}  // namespace shoal
