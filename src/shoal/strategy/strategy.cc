#include "shoal/strategy/strategy.h"

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"
#include "shoal/strategy/async_strategy.h"
#include "shoal/strategy/ssp_strategy.h"
#include "shoal/strategy/sync_strategy.h"

namespace shoal {

absl::StatusOr<std::unique_ptr<TrainingStrategy>> MakeStrategy(const JobConfig& config) {
  if (config.training.mode == "async") return std::unique_ptr<TrainingStrategy>(new AsyncStrategy());
  if (config.training.mode == "sync") return std::unique_ptr<TrainingStrategy>(new SyncStrategy());
  if (config.training.mode == "ssp") return std::unique_ptr<TrainingStrategy>(new SspStrategy());
  return absl::InvalidArgumentError(absl::StrCat("unknown training mode '", config.training.mode, "'"));
}

std::string SspGapCounter(int64_t gap) { return absl::StrCat("ssp_gap/", gap); }

int ReplicasToAggregate(const JobConfig& config, int num_workers) {
  return config.training.replicas_to_aggregate > 0 ? config.training.replicas_to_aggregate : num_workers;
}

int64_t ExamplesPerStep(const JobConfig& config, int num_workers) {
  return config.training.batch_size * (config.training.mode == "sync" ? ReplicasToAggregate(config, num_workers) : 1);
}

int64_t MaxSteps(const JobConfig& config, int64_t train_examples, int num_workers) {
  if (config.training.max_steps > 0) return config.training.max_steps;
  const int64_t per_step = ExamplesPerStep(config, num_workers);
  const int64_t examples = config.training.epochs * train_examples;
  return std::max<int64_t>(1, (examples + per_step - 1) / per_step);
}

absl::StatusOr<double> PullAndComputeGradients(Client& client, Mlp& model, BatchIterator& batches) {
  SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> values, client.Read(model.variable_names()));
  model.Load(values);
  torch::Tensor images, labels;
  batches.Next(&images, &labels);
  for (const auto& p : model.variables()) p.mutable_grad().reset();
  torch::Tensor loss = CrossEntropyLoss(model.Forward(images), labels);
  loss.backward();
  return loss.item<double>();
}

absl::Status InitializeOrWait(WorkerContext& context, const Mlp& model) {
  if (context.is_chief) {
    std::vector<VariableInit> inits;
    for (size_t i = 0; i < model.variables().size(); ++i) {
      inits.push_back({model.variable_names()[i], model.variables()[i].detach(), context.config->training.optimizer,
                       context.config->training.use_locking});
    }
    return context.client->CreateVariables(inits);
  }
  return context.client->WaitForVariables(model.variable_names(),
                                          absl::Seconds(context.config->transport.startup_timeout_s));
}

}  // namespace shoal
