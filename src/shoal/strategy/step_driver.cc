#include "shoal/strategy/step_driver.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shoal/core/status.h"
#include "shoal/model/row_tables.h"
#include "shoal/server/data_leases.h"
#include "shoal/strategy/leased_data.h"
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
  // Leased data: batches from shards of the whole set, taken as the worker goes.
  std::shared_ptr<LeasedData> leased;
  if (context.leases.enabled) {
    leased = std::make_shared<LeasedData>(
        *context.client, context.train_set,
        LeasedData::Options{context.task.ToString(), config.training.batch_size, context.leases.shard_examples,
                            static_cast<uint64_t>(config.training.seed), context.data_fingerprint,
                            context.leases.timeout, context.leases.epochs});
    context.leased_data = leased;
  }
  // While no shard is free: whether the job is over for this worker.
  auto job_over = [&]() -> absl::StatusOr<bool> {
    SHOAL_ASSIGN_OR_RETURN(const std::vector<int64_t> now,
                           context.client->AddToCounters({{kGlobalStep, 0}, {kStopRequested, 0}}));
    return now[0] >= context.max_steps || now[1] != 0;
  };
  WorkerResult result;
  bool join_noted = false;
  // Joining (the job's buffers, then the policy's place in the job) is part
  // of the first step, so that a ps lost while this worker starts, after
  // the variables were there, is recovered from as one lost mid-step is,
  // rather than ending the worker; a rejoin after a restore joins again.
  bool joined = false;
  auto join = [&]() -> absl::Status {
    SHOAL_RETURN_IF_ERROR(LoadJobBuffers(context, model));
    SHOAL_RETURN_IF_ERROR(policy.Join(model));
    if (leased != nullptr) {  // the lease table says where the data stands
      joined = true;
      return absl::OkStatus();
    }
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
    if (context.leave_requested != nullptr && context.leave_requested->load() != 0) return false;
    if (context.before_step) context.before_step(policy.LocalStep());
    {
      PhaseScope timed(Phase::kWait);
      SHOAL_ASSIGN_OR_RETURN(bool may_step, policy.Barrier());
      if (!may_step) return false;
    }
    torch::Tensor input, labels;
    if (leased != nullptr) {
      SHOAL_ASSIGN_OR_RETURN(const bool got, leased->Next(&input, &labels, job_over));
      if (!got) return false;
      context.step_progress = &leased->progress();
    } else {
      batches.Next(&input, &labels);
    }
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
      // dense variables (sync: Persia's hybrid of sync dense and async
      // tables). On leased data they carry the batch's places, which each
      // table's shards apply once on a watermark of their own.
      wire::ProgressAnswer rows_answer;
      if (tables != nullptr && outcome != PushOutcome::kRewound) {
        SHOAL_RETURN_IF_ERROR(leased != nullptr ? tables->Push(&leased->batch_progress(), &rows_answer)
                                                : tables->Push());
      }
      if (leased != nullptr && outcome != PushOutcome::kRewound) {
        if (!policy.SendsEveryStep() && !step.exchanged) {
          // A local step: the next batch follows this one into the same update.
          leased->KeepLocal();
          SHOAL_RETURN_IF_ERROR(leased->RenewIfDue());
        } else {
          // Where the next batch begins: past this one, or over places a
          // task (or a table's shard) did not take.
          leased->Settle(tables != nullptr ? CombineProgress(context.step_answer, rows_answer) : context.step_answer);
          // A worker that joined the running job: from its start to its first applied update.
          if (!join_noted && context.worker_index >= context.num_workers && context.step_answer.applied()) {
            join_noted = true;
            const int64_t ms = absl::ToInt64Milliseconds(absl::Now() - context.started);
            SHOAL_RETURN_IF_ERROR(context.client->AddToCounters({{kJoinsCounter, 1}, {kJoinMsCounter, ms}}).status());
          }
        }
      }
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
  // The chief's buffers as its last step left them: on leased data that
  // step was known to be the last only when the data ran out.
  if (leased != nullptr && context.is_chief && context.chief_publishes_buffers && !context.buffer_names.empty()) {
    SHOAL_RETURN_IF_ERROR(context.client->Assign(context.buffer_names, model.BufferValues()));
  }
  if (leased != nullptr) {
    result.leases_taken = leased->leases_taken();
    result.leases_lost = leased->leases_lost();
  }
  if (tables != nullptr) {
    result.row_cache = tables->cache_stats();
    for (const wire::TableDef& table : tables->TableDefs()) result.tables.push_back(table.name());
  }
  return result;
}

}  // namespace shoal
