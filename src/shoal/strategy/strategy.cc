#include "shoal/strategy/strategy.h"

#include "absl/strings/str_cat.h"
#include "shoal/strategy/async_strategy.h"

namespace shoal {

absl::StatusOr<std::unique_ptr<TrainingStrategy>> MakeStrategy(const JobConfig& config) {
  if (config.training.mode == "async") return std::unique_ptr<TrainingStrategy>(new AsyncStrategy());
  return absl::InvalidArgumentError(absl::StrCat("unknown training mode '", config.training.mode, "'"));
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
