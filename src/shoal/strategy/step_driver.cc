#include "shoal/strategy/step_driver.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shoal/core/status.h"
#include "shoal/model/row_tables.h"
#include "shoal/telemetry/phase.h"

namespace shoal {

absl::StatusOr<Model*> StepPolicy::Start(WorkerContext& context) {
  SHOAL_ASSIGN_OR_RETURN(model_, MakeModel(context.config->model));
  return model_.get();
}

wire::OptimizerConfig StepPolicy::PsOptimizer(const WorkerContext& context) const {
  return context.config->training.optimizer;
}

absl::StatusOr<WorkerResult> DriveSteps(WorkerContext& context, StepPolicy& policy) {
  const StrategyConfig& config = *context.config;
  SHOAL_ASSIGN_OR_RETURN(Model * built, policy.Start(context));
  Model& model = *built;
  const wire::OptimizerConfig optimizer = policy.PsOptimizer(context);
  SHOAL_RETURN_IF_ERROR(InitializeOrWait(context, model, &optimizer));
  context.chief_publishes_buffers = policy.ChiefPublishesBuffers();
  const std::vector<std::string>& names = model.variable_names();
  BatchIterator batches(context.train_shard, config.training.batch_size,
                        config.training.seed * 1000003 + context.worker_index);
  WorkerResult result;
  // Joining (the job's buffers, then the policy's place in the job) is part
  // of the first step, so that a ps lost while this worker starts, after
  // the variables were there, is recovered from as one lost mid-step is,
  // rather than ending the worker; a rejoin after a restore joins again.
  bool joined = false;
  auto join = [&]() -> absl::Status {
    SHOAL_RETURN_IF_ERROR(LoadJobBuffers(context, model));
    SHOAL_RETURN_IF_ERROR(policy.Join(model));
    // Where this worker's data stands for the job: the examples of its steps
    // the ps took in (those drawn since, undone or never sent, are drawn again).
    SHOAL_ASSIGN_OR_RETURN(const int64_t position, ReadDataPosition(context));
    if (position != batches.examples_drawn() || context.unpublished_examples != 0) {
      batches.SeekTo(position);
      context.unpublished_examples = 0;
      if (!joined && position > 0) {
        absl::FPrintF(stderr, "%s: reads its data on from where the job left it, %d examples in (its shard holds %d)\n",
                      context.task.ToString(), position, context.train_shard.size());
      }
    }
    joined = true;
    return absl::OkStatus();
  };
  RowTables* tables = model.row_tables();
  auto step_once = [&]() -> absl::StatusOr<bool> {
    if (!joined) SHOAL_RETURN_IF_ERROR(join());
    if (!policy.HasStepsLeft()) return false;
    if (context.before_step) context.before_step(policy.LocalStep());
    {
      PhaseScope timed(Phase::kWait);
      SHOAL_ASSIGN_OR_RETURN(bool may_step, policy.Barrier());
      if (!may_step) return false;
    }
    torch::Tensor input, labels;
    batches.Next(&input, &labels);
    {
      PhaseScope timed(Phase::kPull);
      SHOAL_RETURN_IF_ERROR(policy.Pull(model));
      if (tables != nullptr) SHOAL_RETURN_IF_ERROR(tables->Pull(input));
    }
    context.unpublished_examples += labels.size(0);
    const BatchResult batch = ComputeGradients(model, input, labels);
    StepInfo step = MakeStepInfo(result.local_steps + 1, policy.GlobalStep(), batch, model);
    const UpdateCheck check = [&](const std::vector<std::string>& update_names,
                                  const std::vector<torch::Tensor>& update) {
      return CheckUpdate(context, update_names, update, step, &result);
    };
    PushOutcome outcome;
    {
      PhaseScope timed(Phase::kPush);
      SHOAL_ASSIGN_OR_RETURN(outcome, policy.Push(model, model.Gradients(), step, check));
      if (outcome == PushOutcome::kStopped) return false;
      // Rows go to the tables asynchronously whatever the mode does with the
      // dense variables (sync: Persia's hybrid of sync dense and async tables).
      if (tables != nullptr && outcome != PushOutcome::kRewound) SHOAL_RETURN_IF_ERROR(tables->Push());
    }
    if (outcome == PushOutcome::kRewound) {
      SHOAL_RETURN_IF_ERROR(join());
      return true;
    }
    if (tables != nullptr) {
      if (const RowTables::CacheStats cache = tables->cache_stats(); cache.lookups > 0) {
        step.scalars.emplace_back("tables/cache_hit_rate", static_cast<double>(cache.hits) / cache.lookups);
      }
    }
    SHOAL_ASSIGN_OR_RETURN(bool go_on, FinishStep(context, step, &result));
    return go_on && outcome == PushOutcome::kStepDone;
  };
  // A lost ps: the chief restores the newest checkpoint and every worker
  // rejoins the job where it now is.
  SHOAL_RETURN_IF_ERROR(StepUntilDone(context, names, model.variables(), optimizer, step_once,
                                      [&]() -> absl::Status {
                                        SHOAL_RETURN_IF_ERROR(CreateRowTables(context, model));
                                        return join();
                                      }));
  SHOAL_RETURN_IF_ERROR(policy.Finish());
  if (tables != nullptr) {
    result.row_cache = tables->cache_stats();
    for (const wire::TableDef& table : tables->TableDefs()) result.tables.push_back(table.name());
  }
  return result;
}

}  // namespace shoal
