#include "shoal/strategy/strategy.h"

#include "shoal/telemetry/phase.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/checkpoint/lease_restore.h"
#include "shoal/core/dtype.h"
#include "shoal/core/status.h"
#include "shoal/model/click_metrics.h"
#include "shoal/model/row_tables.h"
#include "shoal/strategy/leased_data.h"

namespace shoal {

std::string SspGapCounter(int64_t gap) { return absl::StrCat("ssp_gap/", gap); }

std::string DataPositionCounter(int worker_index, int num_workers) {
  return absl::StrCat("data_position/worker_", worker_index, "_of_", num_workers);
}

CounterDelta TakeDataPosition(WorkerContext& context) {
  CounterDelta delta{DataPositionCounter(context.worker_index, context.num_workers), context.unpublished_examples};
  context.unpublished_examples = 0;
  return delta;
}

int ReplicasToAggregate(const StrategyConfig& config, int num_workers) {
  return config.training.replicas_to_aggregate > 0 ? config.training.replicas_to_aggregate : num_workers;
}

BatchResult ComputeGradients(Model& model, BatchIterator& batches) {
  torch::Tensor images, labels;
  batches.Next(&images, &labels);
  return ComputeGradients(model, images, labels);
}

BatchResult ComputeGradients(Model& model, const torch::Tensor& input, const torch::Tensor& labels) {
  PhaseScope timed(Phase::kCompute);
  for (const auto& p : model.variables()) p.mutable_grad().reset();
  torch::Tensor output = model.Forward(input);
  torch::Tensor loss = model.Loss(output, labels);
  loss.backward();
  BatchResult result;
  result.loss = loss.item<double>();
  if (model.classifies()) {
    result.accuracy = output.detach().argmax(1).eq(labels).to(torch::kFloat64).mean().item<double>();
  } else if (model.predicts_clicks()) {
    const torch::Tensor logits = output.detach().reshape(labels.sizes());
    result.accuracy = ClicksPredictedRight(logits, labels).to(torch::kFloat64).mean().item<double>();
    auto metrics = ComputeClickMetrics(torch::sigmoid(logits), labels);
    if (metrics.ok()) result.auc = metrics->auc;
  }
  result.examples = labels.size(0);
  return result;
}

absl::Status PullVariables(Client& client, Model& model) {
  SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> values, client.Read(model.variable_names()));
  model.Load(values);
  return absl::OkStatus();
}

absl::Status PullUnlessPushed(Client& client, Model& model, std::vector<torch::Tensor>* pushed_values) {
  if (pushed_values->empty()) return PullVariables(client, model);
  model.Load(*pushed_values);
  pushed_values->clear();
  return absl::OkStatus();
}

absl::Status PullVariablesAndBuffers(Client& client, Model& model) {
  SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> values, client.Read(model.StateNames()));
  model.LoadState(values);
  return absl::OkStatus();
}

StepInfo MakeStepInfo(int64_t local_step, int64_t global_step, const BatchResult& batch, const Model& model) {
  StepInfo info;
  info.local_step = local_step;
  info.global_step = global_step;
  info.loss = batch.loss;
  info.accuracy = batch.accuracy;
  info.auc = batch.auc;
  info.examples = batch.examples;
  info.model = &model;
  return info;
}

namespace {

// A hook asked to stop: tell every worker through the stop counter.
absl::Status StopJob(WorkerContext& context, const StopRequest& stop, WorkerResult* result) {
  result->stop_reason = stop.reason;
  return context.client->AddToCounter(kStopRequested, 1).status();
}

}  // namespace

absl::StatusOr<bool> CheckUpdate(WorkerContext& context, const std::vector<std::string>& names,
                                 const std::vector<torch::Tensor>& update, const StepInfo& step,
                                 WorkerResult* result) {
  if (context.hooks == nullptr) return true;
  StopRequest stop;
  SHOAL_RETURN_IF_ERROR(context.hooks->BeforeUpdate(names, update, step, &stop));
  if (!stop.requested) return true;
  SHOAL_RETURN_IF_ERROR(StopJob(context, stop, result));
  return false;
}

absl::Status PublishBuffersIfDue(WorkerContext& context, const StepInfo& step, const std::vector<std::string>& names,
                                 const std::function<std::vector<torch::Tensor>()>& values) {
  const bool due =
      step.local_step % context.config->training.buffer_publish_steps == 0 || step.global_step >= context.max_steps;
  if (names.empty() || !due) return absl::OkStatus();
  return context.client->Assign(names, values());
}

absl::Status PublishChiefBuffers(WorkerContext& context, const StepInfo& step) {
  if (!context.is_chief || step.model == nullptr || !context.chief_publishes_buffers) return absl::OkStatus();
  return PublishBuffersIfDue(context, step, context.buffer_names, [&] { return step.model->BufferValues(); });
}

absl::StatusOr<bool> FinishStep(WorkerContext& context, StepInfo& step, WorkerResult* result) {
  SHOAL_RETURN_IF_ERROR(PublishChiefBuffers(context, step));
  if (step.learning_rate < 0) step.learning_rate = context.config->training.optimizer.learning_rate();
  ++result->local_steps;
  result->last_loss = step.loss;
  if (context.on_step) context.on_step(step.global_step, step.loss, step.auc);
  if (context.hooks == nullptr) return true;
  StopRequest stop;
  SHOAL_RETURN_IF_ERROR(context.hooks->AfterStep(step, &stop));
  if (!stop.requested) return true;
  SHOAL_RETURN_IF_ERROR(StopJob(context, stop, result));
  return false;
}

bool AllExist(const std::vector<bool>& exist) {
  return std::all_of(exist.begin(), exist.end(), [](bool e) { return e; });
}

namespace {

// `names` and `values` followed by the context's buffers: what is created,
// waited for and restored together.
std::pair<std::vector<std::string>, std::vector<torch::Tensor>> WithBuffers(const WorkerContext& context,
                                                                            std::vector<std::string> names,
                                                                            std::vector<torch::Tensor> values) {
  names.insert(names.end(), context.buffer_names.begin(), context.buffer_names.end());
  values.insert(values.end(), context.buffer_values.begin(), context.buffer_values.end());
  return {std::move(names), std::move(values)};
}

// Puts `checkpoint` onto the cluster for the variables `names` (shaped as
// `values`, created with `optimizer`): global_step first (on leased data,
// after the lease table, which says where the step count goes on from), so that no worker
// sees restored values at another step; then the variables, created with the
// checkpoint's values where a task lacks them; then every value and slot, so
// that tasks that kept theirs go back to the checkpoint too. Mid-job, the
// job's counters saved with it come back too (the counter task may be the
// one lost); a job started again over a checkpoint begins its counters
// afresh (a new session: nobody is done yet, nobody has asked to stop).
// What a restore put back: the checkpoint's step, and the table rows.
// `step` becomes the step count the restored data goes on from.
absl::Status RestoreLeaseTable(WorkerContext& context, const std::string& checkpoint, const CheckpointIndex& index,
                               int64_t* step);

struct Restored {
  int64_t step = 0;
  int64_t table_rows = 0;
};
absl::StatusOr<Restored> RestoreOnto(WorkerContext& context, const std::string& checkpoint,
                                    const std::vector<std::string>& variable_names,
                                    const std::vector<torch::Tensor>& variable_values,
                                    const wire::OptimizerConfig& optimizer, bool mid_job) {
  Client& client = *context.client;
  const auto [names, values] = WithBuffers(context, variable_names, variable_values);
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& v : values) shapes.emplace_back(v.sizes().begin(), v.sizes().end());
  CheckpointIndex index;
  SHOAL_ASSIGN_OR_RETURN(std::vector<CheckpointVariable> restored, LoadVariables(checkpoint, names, shapes, &index));
  int64_t step = index.step;
  if (context.leases.enabled) SHOAL_RETURN_IF_ERROR(RestoreLeaseTable(context, checkpoint, index, &step));
  SHOAL_RETURN_IF_ERROR(client.SetCounter(kGlobalStep, step).status());
  if (mid_job) {
    SHOAL_RETURN_IF_ERROR(RestoreSavedCounters(client, index));
  } else {
    SHOAL_RETURN_IF_ERROR(RestoreDataPositions(context, index));
    SHOAL_RETURN_IF_ERROR(MatchDataPositions(context));  // before any worker can read its place
  }
  // Counted before any variable comes back, so that a worker that finds the
  // variables again also finds the count moved; the other workers wait for
  // restore_in_progress to fall before they read.
  SHOAL_RETURN_IF_ERROR(client.SetCounter(kRestoreInProgress, 1).status());
  SHOAL_RETURN_IF_ERROR(client.SetCounter(kRestoredStep, step).status());
  SHOAL_RETURN_IF_ERROR(client.AddToCounter(kRestores, 1).status());
  std::vector<VariableInit> inits;
  for (size_t i = 0; i < restored.size(); ++i) {
    inits.push_back({names[i], restored[i].value, optimizer, context.config->training.use_locking,
                     /*buffer=*/i >= variable_names.size()});
  }
  SHOAL_RETURN_IF_ERROR(client.CreateVariables(inits));
  // Values, slots and, for the strategies that use them, accumulators:
  // synchronous steps and rounds start again at the checkpoint's on every task.
  std::optional<int64_t> accumulator_step;
  if (context.restore_accumulator_step) {
    SHOAL_ASSIGN_OR_RETURN(accumulator_step, context.restore_accumulator_step(step));
  }
  SHOAL_RETURN_IF_ERROR(RestoreVariables(client, restored, names, accumulator_step));
  Restored done{step, 0};
  if (!index.table_shards.empty()) {
    // The tables come back with the variables, onto whatever ps count the
    // job has now; a restarted ps task must first hold them again.
    if (!context.table_defs.empty()) SHOAL_RETURN_IF_ERROR(client.CreateTables(context.table_defs));
    SHOAL_ASSIGN_OR_RETURN(done.table_rows, client.RestoreTables(index.step, index.table_shards));
  }
  SHOAL_RETURN_IF_ERROR(client.SetCounter(kRestoreInProgress, 0).status());
  return done;
}

// Whether every variable and table shard of `index` comes back to the task
// that saved it: the same tasks hold the same parts, and the ps tasks hold
// the tables' shards in the same order.
bool SameTasks(const Client& client, const CheckpointIndex& index) {
  const auto& placed = client.placement().variables();
  for (const CheckpointIndex::Variable& variable : index.variables) {
    auto now = placed.find(variable.name);
    if (now == placed.end() || now->second.shards.size() != variable.parts.size()) return false;
    for (size_t i = 0; i < variable.parts.size(); ++i) {
      const CheckpointIndex::Part& part = variable.parts[i];
      if (now->second.shards[i].task.ToString() != index.tasks[static_cast<size_t>(part.shard)] ||
          now->second.shards[i].stored_name != part.stored_name) {
        return false;
      }
    }
  }
  if (index.table_shards.empty()) return true;
  auto ps = client.TableShards();
  if (!ps.ok() || ps->size() != index.table_shards.size()) return false;
  for (size_t i = 0; i < ps->size(); ++i) {
    if ((*ps)[i].ToString() != index.tasks[static_cast<size_t>(index.table_shards[i])]) return false;
  }
  return true;
}

// Leased data: the checkpoint's lease table onto every task, when it has
// one for this data (a checkpoint without one: the data starts afresh).
absl::Status RestoreLeaseTable(WorkerContext& context, const std::string& checkpoint, const CheckpointIndex& index,
                               int64_t* step) {
  if (!index.lease_table.has_value()) return absl::OkStatus();
  const wire::LeaseTableState& table = *index.lease_table;
  if (table.data_fingerprint() != context.data_fingerprint || table.examples() != context.train_set.size()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint '", checkpoint, "' leases data with fingerprint ", table.data_fingerprint(), " (",
        table.examples(), " examples), but this job's training set has fingerprint ", context.data_fingerprint, " (",
        context.train_set.size(), " examples): its lease table cannot say which of these examples were trained"));
  }
  if (table.shard_examples() != context.leases.shard_examples) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint '", checkpoint, "' leases shards of ", table.shard_examples(), " examples; this job asks for ",
        context.leases.shard_examples, " (set data.lease_shard_examples to ", table.shard_examples(), ")"));
  }
  // Each task gets its own watermarks back where its variables and table
  // shards come back to it; otherwise the least of them.
  Client& client = *context.client;
  SHOAL_ASSIGN_OR_RETURN(const LeaseRestore plan, PlanLeaseRestore(index, SameTasks(client, index), checkpoint));
  SHOAL_RETURN_IF_ERROR(
      client.LeaseTable(&plan.table, [&](const TaskId& task) { return plan.MarksFor(task.ToString()); }).status());
  // The step count goes on from the updates the restored counter task holds.
  if (plan.step.has_value()) *step = *plan.step;
  return absl::OkStatus();
}

// "global step 112" and, when there were tables, ", 3021 table rows".
std::string DescribeRestored(const Restored& restored) {
  return absl::StrCat("global step ", restored.step,
                      restored.table_rows > 0 ? absl::StrCat(", ", restored.table_rows, " table rows") : "");
}

}  // namespace

absl::Status RestoreSavedCounters(Client& client, const CheckpointIndex& index) {
  for (const auto& [name, saved] : index.counters) {
    SHOAL_ASSIGN_OR_RETURN(int64_t live, client.AddToCounter(name, 0));
    if (saved > live) SHOAL_RETURN_IF_ERROR(client.SetCounter(name, saved).status());
  }
  return absl::OkStatus();
}

absl::Status RestoreDataPositions(WorkerContext& context, const CheckpointIndex& index) {
  Client& client = *context.client;
  const int num_workers = context.num_workers;
  auto fingerprint = index.counters.find(kDataFingerprint);
  if (fingerprint == index.counters.end()) return absl::OkStatus();  // a checkpoint older than places in the data
  SHOAL_RETURN_IF_ERROR(client.SetCounter(kDataFingerprint, fingerprint->second).status());
  auto data_start = index.counters.find(kDataStartStep);  // older checkpoints: their data began at step 0
  SHOAL_RETURN_IF_ERROR(
      client.SetCounter(kDataStartStep, data_start == index.counters.end() ? 0 : data_start->second).status());
  const std::string any_count = "data_position/";
  auto first = index.counters.lower_bound(any_count);
  if (first == index.counters.end() || !absl::StartsWith(first->first, any_count)) {
    return absl::OkStatus();  // a mode that keeps none (the gated ensemble)
  }
  bool all_kept = true;
  for (int w = 0; w < num_workers; ++w) {
    if (index.counters.count(DataPositionCounter(w, num_workers)) == 0) all_kept = false;
  }
  for (int w = 0; w < num_workers; ++w) {
    const std::string name = DataPositionCounter(w, num_workers);
    SHOAL_RETURN_IF_ERROR(client.SetCounter(name, all_kept ? index.counters.at(name) : 0).status());
  }
  if (!all_kept) {
    absl::FPrintF(stderr,
                  "%s: the checkpoint keeps its workers' places in the data for another number of workers: each of "
                  "these %d reads its shard from the start\n",
                  context.task.ToString(), num_workers);
  }
  return absl::OkStatus();
}

int64_t KeptDataPosition(const WorkerContext& context, const CheckpointIndex& index, int worker_index) {
  auto fingerprint = index.counters.find(kDataFingerprint);
  if (fingerprint == index.counters.end() || fingerprint->second != context.data_fingerprint) return 0;
  auto position = index.counters.find(DataPositionCounter(worker_index, context.num_workers));
  return position == index.counters.end() ? 0 : position->second;
}

absl::StatusOr<int64_t> ReadDataPosition(WorkerContext& context) {
  const std::string counter = DataPositionCounter(context.worker_index, context.num_workers);
  SHOAL_ASSIGN_OR_RETURN(const int64_t position, context.client->AddToCounter(counter, 0));
  if (position < 0) {
    return absl::DataLossError(absl::StrCat("counter '", counter, "' holds ", position, ", not a place in ",
                                            context.task.ToString(), "'s data"));
  }
  return position;
}

absl::Status MatchDataPositions(WorkerContext& context) {
  Client& client = *context.client;
  SHOAL_ASSIGN_OR_RETURN(const int64_t kept_for, client.AddToCounter(kDataFingerprint, 0));
  if (kept_for == context.data_fingerprint) return absl::OkStatus();
  if (kept_for != 0) {
    absl::FPrintF(stderr,
                  "%s: the training data is not the data the job's places in it were kept for: each worker reads "
                  "its shard from the start\n",
                  context.task.ToString());
  }
  for (int w = 0; w < context.num_workers; ++w) {
    SHOAL_RETURN_IF_ERROR(client.SetCounter(DataPositionCounter(w, context.num_workers), 0).status());
  }
  // This data begins at the job's step now (0, or the restored checkpoint's).
  SHOAL_ASSIGN_OR_RETURN(const int64_t step, client.AddToCounter(kGlobalStep, 0));
  SHOAL_RETURN_IF_ERROR(client.SetCounter(kDataStartStep, step).status());
  return client.SetCounter(kDataFingerprint, context.data_fingerprint).status();
}

absl::StatusOr<std::vector<bool>> VariablesOnceAnswered(WorkerContext& context, const std::vector<std::string>& names,
                                                        const absl::Status& error) {
  const absl::Duration timeout = absl::Seconds(context.config->transport.startup_timeout_s);
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    auto exist = context.client->VariablesExist(names);
    if (exist.ok()) return exist;
    if (absl::Now() > give_up) {
      return Annotate(error, absl::StrCat("no recovery within ", absl::FormatDuration(timeout), ": ",
                                          exist.status().message()));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

absl::StatusOr<std::unique_ptr<CheckpointInUse>> CheckpointToRecoverFrom(const WorkerContext& context,
                                                                         const absl::Status& error) {
  auto latest =
      HoldLatestCheckpoint(context.config->checkpoint.dir, context.config->checkpoint.on_corrupt == "fall_back");
  if (!latest.ok()) return Annotate(error, absl::StrCat("cannot recover: ", latest.status().message()));
  return latest;
}

bool Recoverable(const WorkerContext& context, const absl::Status& error) {
  return !context.config->checkpoint.dir.empty() &&
         (absl::IsUnavailable(error) || absl::IsNotFound(error) || absl::IsDeadlineExceeded(error));
}

namespace {

// Waits for a restore in progress (the chief's, which raised the flag before
// it made anything again) to end, until `give_up`; `error` is what the wait
// is for.
absl::Status WaitForRestoreToEnd(WorkerContext& context, absl::Time give_up, const absl::Status& error) {
  while (true) {
    SHOAL_ASSIGN_OR_RETURN(int64_t restoring, context.client->AddToCounter(kRestoreInProgress, 0));
    if (restoring == 0) return absl::OkStatus();
    if (absl::Now() > give_up) {
      return Annotate(error, absl::StrCat("the chief's restore did not finish within ",
                                          context.config->transport.startup_timeout_s, " s"));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// Aborted when the chief gave up starting the job (it raised job_aborted),
// saying this worker no longer waits for `what`.
absl::Status UnlessTheChiefGaveUp(WorkerContext& context, absl::string_view what) {
  absl::StatusOr<int64_t> aborted = context.client->AddToCounter(kJobAborted, 0);
  if (!aborted.ok() || *aborted == 0) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(context.task.ToString(),
                                         ": the chief failed to start the job (its error says why); not waiting for ",
                                         what));
}

// Whether every ps task holds its shard of each of the job's tables: false
// when one lacks a table (a restarted task, empty).
absl::StatusOr<bool> TablesExist(WorkerContext& context) {
  for (const wire::TableDef& table : context.table_defs) {
    absl::StatusOr<Client::TableOccupancy> held = context.client->Occupancy(table.name());
    if (absl::IsNotFound(held.status())) return false;
    SHOAL_RETURN_IF_ERROR(held.status());
  }
  return true;
}

}  // namespace

absl::Status RecoverLostVariables(WorkerContext& context, const std::vector<std::string>& variable_names,
                                  const std::vector<torch::Tensor>& shapes_from,
                                  const wire::OptimizerConfig& optimizer, const absl::Status& error) {
  Client& client = *context.client;
  const std::vector<std::string> names = WithBuffers(context, variable_names, {}).first;
  const absl::Duration timeout = absl::Seconds(context.config->transport.startup_timeout_s);
  absl::FPrintF(stderr, "%s: %s; waiting for the job to recover\n", context.task.ToString(), error.message());
  const absl::Time give_up = absl::Now() + timeout;
  if (!context.is_chief) {
    absl::Status back = client.WaitForVariables(names, timeout);
    if (!back.ok()) return Annotate(error, absl::StrCat("the variables did not come back: ", back.message()));
    // The variables exist again; their values are the checkpoint's once the
    // chief's restore is over. (The tables: CreateRowTables, on rejoining.)
    return WaitForRestoreToEnd(context, give_up, error);
  }
  SHOAL_ASSIGN_OR_RETURN(std::vector<bool> exist, VariablesOnceAnswered(context, names, error));
  // A ps task may hold table shards and no variable (more ps tasks than
  // variables): its tables count too.
  SHOAL_ASSIGN_OR_RETURN(const bool tables_exist, TablesExist(context));
  if (AllExist(exist) && tables_exist) return absl::OkStatus();
  // Every task answers, and some lack their variables or tables: restore.
  SHOAL_ASSIGN_OR_RETURN(const std::unique_ptr<CheckpointInUse> held, CheckpointToRecoverFrom(context, error));
  const std::string& latest = held->path();
  SHOAL_ASSIGN_OR_RETURN(const Restored restored,
                         RestoreOnto(context, latest, variable_names, shapes_from, optimizer, /*mid_job=*/true));
  context.recoveries.push_back(absl::StrCat("restored ", latest, " (", DescribeRestored(restored), ") after: ",
                                            error.message(), " (tasks seen restarted so far: ",
                                            client.restarts_seen(), ")"));
  absl::FPrintF(stderr, "%s: %s\n", context.task.ToString(), context.recoveries.back());
  return absl::OkStatus();
}

absl::Status NoteJobState(WorkerContext& context) {
  SHOAL_ASSIGN_OR_RETURN(context.restores_known, context.client->AddToCounter(kRestores, 0));
  context.restarts_known = context.client->restarts_seen();
  return absl::OkStatus();
}

absl::Status JobRewound(WorkerContext& context) {
  if (context.client->restarts_seen() != context.restarts_known) {
    return absl::UnavailableError(
        absl::StrCat(context.task.ToString(), ": a task of the job restarted while this worker waited"));
  }
  SHOAL_ASSIGN_OR_RETURN(int64_t restores, context.client->AddToCounter(kRestores, 0));
  if (restores != context.restores_known) {
    return absl::UnavailableError(absl::StrCat(context.task.ToString(),
                                               ": the job was restored from a checkpoint while this worker waited"));
  }
  return absl::OkStatus();
}

absl::Status StepUntilDone(WorkerContext& context, const std::function<absl::StatusOr<bool>()>& step,
                           const std::function<absl::Status(const absl::Status& error)>& recover) {
  while (true) {
    absl::StatusOr<bool> go_on = step();
    if (!go_on.ok() && Recoverable(context, go_on.status())) {
      SHOAL_RETURN_IF_ERROR(recover(go_on.status()));
      continue;
    }
    SHOAL_RETURN_IF_ERROR(go_on.status());
    if (!*go_on) return absl::OkStatus();
  }
}

absl::Status StepUntilDone(WorkerContext& context, const std::vector<std::string>& names,
                           const std::vector<torch::Tensor>& shapes_from, const wire::OptimizerConfig& optimizer,
                           const std::function<absl::StatusOr<bool>()>& step,
                           const std::function<absl::Status()>& rejoin) {
  // A ps task died (and is perhaps back, empty): the chief restores the
  // newest checkpoint and everyone goes on from it.
  return StepUntilDone(context, step, [&](const absl::Status& error) -> absl::Status {
    SHOAL_RETURN_IF_ERROR(RecoverLostVariables(context, names, shapes_from, optimizer, error));
    SHOAL_RETURN_IF_ERROR(NoteJobState(context));
    return rejoin ? rejoin() : absl::OkStatus();
  });
}

namespace {

std::vector<std::string> WorkerNames(const WorkerContext& context) {
  std::vector<std::string> names;
  for (const TaskId& w : context.workers) names.push_back(w.ToString());
  return names;
}

// Between the long polls of a barrier: whether a hook stopped the job, or
// Aborted when a task gave up on a synchronous exchange (`what`) and set
// job_aborted to release the others.
absl::StatusOr<bool> StoppedOrAborted(WorkerContext& context, absl::string_view what) {
  SHOAL_ASSIGN_OR_RETURN(bool stopped, JobStopRequested(*context.client));
  if (stopped) return true;
  SHOAL_RETURN_IF_ERROR(JobRewound(context));
  SHOAL_ASSIGN_OR_RETURN(int64_t aborted, context.client->AddToCounter(kJobAborted, 0));
  if (aborted > 0) {
    return absl::AbortedError(absl::StrCat(context.task.ToString(), ": another task ended the job during ", what,
                                           " (a synchronous exchange could not complete)"));
  }
  return false;
}

}  // namespace

absl::StatusOr<int64_t> WaitForCounter(WorkerContext& context, const std::string& name, int64_t target,
                                       absl::Duration timeout, const std::string& what, const TaskId* completer) {
  PhaseScope timed(Phase::kWait);
  Client& client = *context.client;
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    // Long polls of the server's longest (200 ms); a wait costs a few small
    // calls a second, which keeps the barrier's traffic negligible.
    SHOAL_ASSIGN_OR_RETURN(int64_t value, client.PollCounter(name, target, absl::Milliseconds(200)));
    if (value >= target) return value;
    SHOAL_ASSIGN_OR_RETURN(bool stopped, StoppedOrAborted(context, what));
    if (stopped) return 0;
    if (absl::Now() > give_up) {
      const std::string who =
          completer != nullptr ? completer->ToString()
                               : absl::StrCat("the chief ", context.workers.empty() ? "" : context.workers[0].ToString());
      return absl::DeadlineExceededError(absl::StrCat(context.task.ToString(), " waited ", absl::FormatDuration(timeout),
                                                      " for ", what, "; ", who, " did not complete it"));
    }
  }
}

absl::StatusOr<bool> ApplyAccumulatedOrStop(WorkerContext& context, const std::vector<std::string>& names,
                                            int replicas, int64_t new_step, wire::AccumulatedRule rule,
                                            const std::function<absl::StatusOr<int>()>& replicas_now) {
  const std::vector<std::string> workers = WorkerNames(context);
  const absl::Duration timeout = absl::Seconds(context.config->training.sync_timeout_s);
  const absl::Time give_up = absl::Now() + timeout;
  // Membership is asked again five times a second: a worker gone is not waited for long.
  const absl::Duration longest_try = replicas_now ? absl::Milliseconds(200) : absl::Seconds(1);
  while (true) {
    if (replicas_now) {
      SHOAL_ASSIGN_OR_RETURN(replicas, replicas_now());
    }
    // Short tries, so that a stop asked meanwhile is seen within a second.
    const absl::Duration slice = std::min(longest_try, std::max(give_up - absl::Now(), absl::Milliseconds(1)));
    absl::Status applied = context.client->ApplyAccumulated(names, replicas, new_step, slice, workers, rule);
    if (applied.ok()) return true;
    if (absl::IsDeadlineExceeded(applied)) {
      SHOAL_ASSIGN_OR_RETURN(bool stopped, JobStopRequested(*context.client));
      if (stopped) return false;
      SHOAL_RETURN_IF_ERROR(JobRewound(context));
      if (absl::Now() < give_up) continue;
      applied = absl::DeadlineExceededError(
          absl::StrCat("after ", absl::FormatDuration(timeout), ": ", applied.message()));
    }
    // A lost ps is recovered from (StepUntilDone); anything else ends the
    // job, and the others are released.
    if (!Recoverable(context, applied)) context.client->AddToCounter(kJobAborted, 1).IgnoreError();
    return applied;
  }
}

absl::StatusOr<StepWait> ReadAtStepOrStop(WorkerContext& context, const std::vector<std::string>& names,
                                          int64_t min_step, int replicas, const std::function<absl::Status()>& resend) {
  PhaseScope timed(Phase::kWait);
  Client& client = *context.client;
  const absl::Duration timeout = absl::Seconds(context.config->training.sync_timeout_s);
  const absl::Time give_up = absl::Now() + timeout;
  absl::Time next_resend = absl::Now() + absl::Seconds(1);
  StepWait wait;
  while (true) {
    // The server's longest wait; a stop or an abort is seen between waits.
    SHOAL_ASSIGN_OR_RETURN(wait.values, client.ReadAtStep(names, min_step, absl::Milliseconds(200)));
    if (wait.values.ready) return wait;
    if (wait.values.step < min_step - 1) {
      wait.rewound = true;
      return wait;
    }
    SHOAL_ASSIGN_OR_RETURN(bool stopped, StoppedOrAborted(context, absl::StrCat("step ", min_step)));
    if (stopped) return wait;
    // Leased data: a worker waiting for the others keeps its shard.
    if (context.leased_data != nullptr) SHOAL_RETURN_IF_ERROR(context.leased_data->RenewIfDue());
    if (resend && absl::Now() >= next_resend) {
      SHOAL_RETURN_IF_ERROR(resend());
      next_resend = absl::Now() + absl::Seconds(1);
    }
    if (absl::Now() > give_up) {
      client.AddToCounter(kJobAborted, 1).IgnoreError();  // release the others
      return Annotate(IncompleteStepError(min_step, static_cast<int>(wait.values.heard_from.size()), replicas, timeout,
                                          WorkerNames(context), wait.values.heard_from),
                      context.task.ToString());
    }
  }
}

absl::StatusOr<bool> JobStopRequested(Client& client) {
  SHOAL_ASSIGN_OR_RETURN(int64_t stops, client.AddToCounter(kStopRequested, 0));
  return stops > 0;
}

namespace {

// One forward pass on two training examples before any training, so that a
// model that does not fit the data fails at start, naming the shapes, and
// not in the middle of a step.
absl::Status CheckModelFitsData(const WorkerContext& context, Model& model) {
  const Dataset& data = context.train_shard;
  if (data.size() == 0) return absl::OkStatus();
  const ModelConfig& config = context.config->model;
  const std::string what = config.kind == "torchscript" ? absl::StrCat("model.path '", config.path, "'")
                           : config.module != nullptr  ? absl::StrCat("module '", config.module->name, "'")
                                                       : "the built-in model";
  const torch::Tensor images = data.images.narrow(0, 0, std::min<int64_t>(2, data.size()));
  const torch::Tensor labels = data.labels.narrow(0, 0, images.size(0));
  if (model.classifies() != (data.labels.scalar_type() == torch::kInt64)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.loss ", config.loss, " needs ", model.classifies() ? "int64 class labels" : "float32 targets",
        "; the data's labels are ", DTypeName(data.labels.scalar_type())));
  }
  torch::NoGradGuard no_grad;
  if (RowTables* tables = model.row_tables()) {
    absl::Status pulled = tables->Pull(images);
    // A worker that finds a ps task lost as it starts (its tables gone)
    // leaves the check to the chief, which checks the same model and data,
    // and recovers in its first step.
    if (!pulled.ok() && !context.is_chief && Recoverable(context, pulled)) return absl::OkStatus();
    SHOAL_RETURN_IF_ERROR(Annotate(pulled, what));
  }
  // Evaluating, so that the check moves no BatchNorm statistics.
  model.SetTraining(false);
  absl::StatusOr<torch::Tensor> forward = ForwardOrError(model, images, what);
  model.SetTraining(true);
  SHOAL_RETURN_IF_ERROR(forward.status());
  const torch::Tensor& logits = *forward;
  if (!model.classifies()) {
    if (logits.size(0) != labels.size(0) || logits.numel() != labels.numel()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": forward() maps a batch of shape ", ShapeString(images.sizes()),
                                                     " to ", ShapeString(logits.sizes()), "; the targets are ",
                                                     ShapeString(labels.sizes())));
    }
    return absl::OkStatus();
  }
  const int64_t largest_label = data.labels.max().item<int64_t>();
  if (logits.dim() != 2 || logits.size(0) != images.size(0) || logits.size(1) <= largest_label) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": forward() maps a batch of shape ", ShapeString(images.sizes()), " to ",
        ShapeString(logits.sizes()), "; expected [", images.size(0), ", C] logits with C > ", largest_label,
        " (the largest label)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CreateRowTables(WorkerContext& context, Model& model) {
  RowTables* tables = model.row_tables();
  if (tables == nullptr) return absl::OkStatus();
  tables->Bind(context.client);
  context.table_defs = tables->TableDefs();
  if (context.is_chief) return context.client->CreateTables(context.table_defs);
  // The others wait for the chief's tables: one that another worker made
  // again on a restarted ps task would hide its lost rows from the chief,
  // which restores them. Made, they hold the checkpoint's rows once a
  // restore in progress is over.
  const absl::Duration timeout = absl::Seconds(context.config->transport.startup_timeout_s);
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    SHOAL_ASSIGN_OR_RETURN(const bool exist, TablesExist(context));
    if (exist) break;
    SHOAL_RETURN_IF_ERROR(UnlessTheChiefGaveUp(context, "the tables"));
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(absl::StrCat(context.task.ToString(),
                                                      ": the job's tables were not on every ps task within ",
                                                      absl::FormatDuration(timeout), " (the chief makes them)"));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return WaitForRestoreToEnd(context, give_up, absl::DeadlineExceededError(context.task.ToString()));
}

absl::Status InitializeOrWait(WorkerContext& context, Model& model, const wire::OptimizerConfig* optimizer) {
  // A model with row tables pulls rows in its forward pass: the check waits for its tables.
  SHOAL_RETURN_IF_ERROR(CreateRowTables(context, model));
  SHOAL_RETURN_IF_ERROR(CheckModelFitsData(context, model));
  context.buffer_names = model.buffer_names();
  context.buffer_values = model.BufferValues();
  return InitializeOrWait(context, model.variable_names(), model.variables(),
                          optimizer ? *optimizer : context.config->training.optimizer);
}

absl::Status LoadJobBuffers(WorkerContext& context, Model& model) {
  if (context.buffer_names.empty()) return absl::OkStatus();
  SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> buffers, context.client->Read(context.buffer_names));
  model.LoadBuffers(buffers);
  return absl::OkStatus();
}

absl::StatusOr<std::string> CheckpointToRestore(WorkerContext& context, const std::vector<std::string>& names) {
  const std::string& dir = context.config->checkpoint.dir;
  if (dir.empty()) return std::string();
  auto latest = LatestCheckpoint(dir, context.config->checkpoint.on_corrupt == "fall_back");
  if (absl::IsNotFound(latest.status())) return std::string();
  SHOAL_RETURN_IF_ERROR(latest.status());
  if (context.config->checkpoint.restore == "always") return *latest;
  SHOAL_ASSIGN_OR_RETURN(std::vector<bool> exist, context.client->VariablesExist(names));
  if (AllExist(exist)) {
    absl::FPrintF(stderr, "%s: the variables are live on their tasks; not restoring %s\n", context.task.ToString(),
                  *latest);
    return std::string();
  }
  return *latest;
}

namespace {

// The chief's part of starting a job: create the variables, or restore them
// from the checkpoint that applies.
absl::Status InitializeAsChief(WorkerContext& context, const std::vector<std::string>& names,
                               const std::vector<torch::Tensor>& values, const wire::OptimizerConfig& optimizer) {
  // The ps tasks may still be starting (the local launcher starts every
  // task at once): a chief that got there first waits for them.
  SHOAL_RETURN_IF_ERROR(
      context.client->WaitForTasksHolding(names, absl::Seconds(context.config->transport.startup_timeout_s)));
  const auto [all_names, all_values] = WithBuffers(context, names, values);
  SHOAL_ASSIGN_OR_RETURN(std::string checkpoint, CheckpointToRestore(context, all_names));
  if (checkpoint.empty()) {
    // Before the variables exist, which is when the other workers start.
    SHOAL_RETURN_IF_ERROR(MatchDataPositions(context));
    std::vector<VariableInit> inits;
    for (size_t i = 0; i < all_values.size(); ++i) {
      inits.push_back({all_names[i], all_values[i].detach(), optimizer, context.config->training.use_locking,
                       /*buffer=*/i >= names.size()});
    }
    return context.client->CreateVariables(inits);
  }
  SHOAL_ASSIGN_OR_RETURN(const Restored restored,
                         RestoreOnto(context, checkpoint, names, values, optimizer, /*mid_job=*/false));
  context.restored_step = restored.step;
  context.restored_from = checkpoint;
  absl::FPrintF(stderr, "%s: restored %s (%s)\n", context.task.ToString(), checkpoint, DescribeRestored(restored));
  return absl::OkStatus();
}

// The other workers wait for the chief's variables, and give up within a
// second of the chief failing (a corrupt checkpoint, say) rather than after
// the whole start-up timeout.
absl::Status WaitForTheChief(WorkerContext& context, const std::vector<std::string>& names) {
  const absl::Time give_up = absl::Now() + absl::Seconds(context.config->transport.startup_timeout_s);
  while (true) {
    const absl::Duration slice = std::min(absl::Seconds(1), std::max(absl::ZeroDuration(), give_up - absl::Now()));
    absl::Status waited = context.client->WaitForVariables(names, slice);
    // A chief that restores makes the variables after it raised the restore
    // flag: they hold the checkpoint's values (and the tables its rows) once
    // it has fallen.
    if (waited.ok()) return WaitForRestoreToEnd(context, give_up, absl::DeadlineExceededError(context.task.ToString()));
    SHOAL_RETURN_IF_ERROR(UnlessTheChiefGaveUp(context, "the variables"));
    if (absl::Now() >= give_up) return waited;
  }
}

}  // namespace

absl::Status InitializeOrWait(WorkerContext& context, const std::vector<std::string>& names,
                              const std::vector<torch::Tensor>& values, const wire::OptimizerConfig& optimizer) {
  if (context.is_chief) {
    absl::Status started = InitializeAsChief(context, names, values, optimizer);
    if (!started.ok()) {
      context.client->AddToCounter(kJobAborted, 1).IgnoreError();  // release the workers waiting for us
      return started;
    }
  } else {
    SHOAL_RETURN_IF_ERROR(WaitForTheChief(context, WithBuffers(context, names, {}).first));
  }
  context.startup_bytes_sent = context.client->bytes_sent();
  context.startup_bytes_received = context.client->bytes_received();
  context.startup_tensor_bytes_sent = context.client->tensor_bytes_sent();
  return NoteJobState(context);
}

}  // namespace shoal
