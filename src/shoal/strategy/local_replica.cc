#include "shoal/strategy/local_replica.h"

#include "shoal/core/status.h"

namespace shoal {

absl::StatusOr<std::unique_ptr<LocalReplica>> LocalReplica::Create(const ModelConfig& model,
                                                                   const wire::OptimizerConfig& optimizer) {
  SHOAL_ASSIGN_OR_RETURN(auto rule, Optimizer::Create(optimizer));
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> built, MakeModel(model));
  return std::unique_ptr<LocalReplica>(new LocalReplica(std::move(built), std::move(rule)));
}

LocalReplica::LocalReplica(std::unique_ptr<Model> model, std::shared_ptr<const Optimizer> optimizer)
    : model_(std::move(model)), optimizer_(std::move(optimizer)) {
  for (const auto& v : model_->variables()) slots_.push_back(optimizer_->MakeSlots(v));
  SettleBuffers();
}

std::vector<torch::Tensor> LocalReplica::Values() const {
  std::vector<torch::Tensor> values;
  for (const auto& v : model_->variables()) values.push_back(v.detach().clone());
  return values;
}

void LocalReplica::Apply(const std::vector<torch::Tensor>& gradients) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < gradients.size(); ++i) {
    torch::Tensor value = model_->variables()[i].detach();  // shares the parameter's memory
    optimizer_->Apply(value, gradients[i], slots_[i]);
  }
}

std::vector<torch::Tensor> LocalReplica::BufferDrift(int workers) const {
  std::vector<torch::Tensor> drift;
  const std::vector<torch::Tensor>& now = model_->buffers();
  for (size_t i = 0; i < now.size(); ++i) {
    torch::Tensor moved = now[i].detach() - settled_buffers_[i];
    drift.push_back(moved.is_floating_point() ? moved.div_(workers) : moved);
  }
  return drift;
}

absl::Status FetchGlobal(Client& client, LocalReplica& replica) {
  SHOAL_RETURN_IF_ERROR(PullVariablesAndBuffers(client, replica.model()));
  replica.SettleBuffers();
  return absl::OkStatus();
}

absl::Status PushBufferDrift(WorkerContext& context, LocalReplica& replica) {
  const std::vector<std::string>& names = replica.model().buffer_names();
  if (names.empty()) return absl::OkStatus();
  SHOAL_RETURN_IF_ERROR(context.client->AddToVariables(names, replica.BufferDrift(context.num_workers)).status());
  replica.SettleBuffers();
  return absl::OkStatus();
}

int64_t LocalStepsInRound(const LocalReplicaConfig& config, int64_t round) {
  return round < config.warmup_steps ? 1 : config.interval_steps;
}

int64_t RoundAtLocalStep(const LocalReplicaConfig& config, int64_t local_step) {
  int64_t round = 0;
  for (int64_t covered = LocalStepsInRound(config, 0); covered <= local_step;
       covered += LocalStepsInRound(config, ++round)) {
  }
  return round;
}

int64_t AveragingRounds(const LocalReplicaConfig& config, int64_t max_steps, int num_workers) {
  const int64_t per_worker = (max_steps + num_workers - 1) / num_workers;
  const int64_t warmup = std::min<int64_t>(config.warmup_steps, per_worker);
  return warmup + (per_worker - warmup + config.interval_steps - 1) / config.interval_steps;
}

namespace {

BatchIterator WorkerBatches(const WorkerContext& context) {
  return BatchIterator(context.train_shard, context.config->training.batch_size,
                       context.config->training.seed * 1000003 + context.worker_index);
}

// What sending an asynchronous exchange gave.
struct Push {
  bool sent = false;  // false: a hook stopped training, nothing was sent
  bool last = false;  // the job is stopped or has reached max_steps
};

// Checks `update` with the hooks, then sends it (gradients for the ps's
// optimizer, or deltas to add), advancing global_step by `steps`.
absl::StatusOr<Push> PushExchange(WorkerContext& context, const std::vector<std::string>& names,
                                  const std::vector<torch::Tensor>& update, wire::UpdateRule rule, int64_t steps,
                                  StepInfo& info, WorkerResult* result) {
  SHOAL_ASSIGN_OR_RETURN(bool send, CheckUpdate(context, names, update, info, result));
  if (!send) return Push{};
  const std::vector<CounterDelta> counters = {{kGlobalStep, steps}, {kStopRequested, 0}};
  SHOAL_ASSIGN_OR_RETURN(std::vector<int64_t> values, rule == wire::UPDATE_ADD
                                                          ? context.client->AddToVariables(names, update, counters)
                                                          : context.client->ApplyGradients(names, update, counters));
  info.global_step = values[0];
  info.exchanged = true;
  return Push{true, values[1] > 0 || values[0] >= context.max_steps};
}

std::vector<torch::Tensor> ZerosLike(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> zeros;
  for (const auto& t : tensors) zeros.push_back(torch::zeros_like(t));
  return zeros;
}

}  // namespace

// Downpour (Dean et al., 2012): fetch every n_fetch steps, train locally, and
// push the summed gradients every n_push steps for the ps's optimizer.
absl::StatusOr<WorkerResult> DownpourStrategy::RunWorker(WorkerContext& context) {
  const LocalReplicaConfig& local = context.config->local;
  SHOAL_ASSIGN_OR_RETURN(auto replica, LocalReplica::Create(context.config->model, local.optimizer));
  SHOAL_RETURN_IF_ERROR(InitializeOrWait(context, replica->model()));
  const std::vector<std::string>& names = replica->names();
  BatchIterator batches = WorkerBatches(context);
  std::vector<torch::Tensor> pending = ZerosLike(replica->model().variables());  // gradients not yet pushed
  WorkerResult result;
  int64_t global_step = 0;
  int64_t step = 0;
  auto step_once = [&]() -> absl::StatusOr<bool> {
    if (context.before_step) context.before_step(step);
    if (step % local.n_fetch == 0) SHOAL_RETURN_IF_ERROR(FetchGlobal(*context.client, *replica));
    BatchResult batch = ComputeGradients(replica->model(), batches);
    const std::vector<torch::Tensor> gradients = replica->model().Gradients();
    for (size_t i = 0; i < gradients.size(); ++i) pending[i].add_(gradients[i]);
    replica->Apply(gradients);
    StepInfo info = MakeStepInfo(step + 1, global_step, batch, replica->model());
    bool last = false;
    if ((step + 1) % local.n_push == 0) {
      SHOAL_ASSIGN_OR_RETURN(Push push, PushExchange(context, names, pending, wire::UPDATE_OPTIMIZER, local.n_push,
                                                     info, &result));
      if (!push.sent) return false;
      SHOAL_RETURN_IF_ERROR(PushBufferDrift(context, *replica));
      for (auto& p : pending) p.zero_();
      global_step = info.global_step;
      last = push.last;
    }
    ++step;
    SHOAL_ASSIGN_OR_RETURN(bool go_on, FinishStep(context, info, &result));
    return go_on && !last;
  };
  // After a restore: the restored values, and no gradients from before it.
  auto rejoin = [&]() -> absl::Status {
    for (auto& p : pending) p.zero_();
    return FetchGlobal(*context.client, *replica);
  };
  SHOAL_RETURN_IF_ERROR(StepUntilDone(context, names, replica->model().variables(),
                                      context.config->training.optimizer, step_once, rejoin));
  return result;
}

// Model averaging (TensorFlow's ModelAverageOptimizer; BMUF with block
// momentum): train locally, and at the end of every round average the local
// copies at a barrier through the ps's accumulators; everyone continues from
// the average.
absl::StatusOr<WorkerResult> ModelAverageStrategy::RunWorker(WorkerContext& context) {
  const LocalReplicaConfig& local = context.config->local;
  Client& client = *context.client;
  const int workers = context.num_workers;
  SHOAL_ASSIGN_OR_RETURN(auto replica, LocalReplica::Create(context.config->model, local.optimizer));
  // With block momentum the global copy keeps BMUF's bg as a momentum slot:
  // momentum SGD on (global - average) is exactly bg = m*bg + lr*(global - average).
  wire::OptimizerConfig block;
  block.set_kind("momentum");
  block.set_learning_rate(local.block_learning_rate);
  block.set_momentum(local.block_momentum);
  // A restore puts the rounds, and the accumulators that average them, at
  // the round the checkpoint's step ends.
  context.restore_accumulator_step = [&](int64_t global_step) -> absl::StatusOr<int64_t> {
    const int64_t round = RoundAtLocalStep(local, global_step / workers);
    SHOAL_RETURN_IF_ERROR(client.SetCounter(kAverageRound, round).status());
    return round;
  };
  SHOAL_RETURN_IF_ERROR(InitializeOrWait(context, replica->model(), &block));
  const wire::AccumulatedRule rule = local.block_momentum > 0 ? wire::BLOCK_MOMENTUM : wire::ASSIGN_MEAN;
  const std::vector<std::string>& names = replica->names();
  const int64_t rounds = AveragingRounds(local, context.max_steps, workers);
  const absl::Duration timeout = absl::Seconds(context.config->training.sync_timeout_s);
  BatchIterator batches = WorkerBatches(context);
  WorkerResult result;
  int64_t round = 0;        // the averaging round in progress
  int64_t in_round = 0;     // local steps taken in it
  int64_t local_step = 0;   // before it, and in it
  int64_t global_step = 0;  // before it: every worker takes the same steps per round
  // At the start (a restarted worker joins the round in progress) and after
  // a restore: from the global copy, at the start of the job's round.
  auto join = [&]() -> absl::Status {
    SHOAL_ASSIGN_OR_RETURN(round, client.AddToCounter(kAverageRound, 0));
    local_step = 0;
    for (int64_t r = 0; r < round; ++r) local_step += LocalStepsInRound(local, r);
    global_step = local_step * workers;
    in_round = 0;
    return FetchGlobal(client, *replica);
  };
  SHOAL_RETURN_IF_ERROR(join());
  auto step_once = [&]() -> absl::StatusOr<bool> {
    if (round >= rounds) return false;
    const int64_t steps = LocalStepsInRound(local, round);
    if (context.before_step) context.before_step(local_step);
    BatchResult batch = ComputeGradients(replica->model(), batches);
    replica->Apply(replica->model().Gradients());
    ++local_step;
    StepInfo info = MakeStepInfo(local_step, global_step, batch, replica->model());
    if (++in_round < steps) return FinishStep(context, info, &result);
    // The round's last step: average.
    const std::vector<torch::Tensor> values = replica->Values();
    SHOAL_ASSIGN_OR_RETURN(bool send, CheckUpdate(context, names, values, info, &result));
    if (!send) return false;
    // The buffers' drift first: all of it is in before the barrier releases anyone.
    SHOAL_RETURN_IF_ERROR(PushBufferDrift(context, *replica));
    SHOAL_RETURN_IF_ERROR(client.Accumulate(names, values, round, context.task.ToString()).status());
    if (context.is_chief) {
      SHOAL_ASSIGN_OR_RETURN(bool applied, ApplyAccumulatedOrStop(context, names, workers, round + 1, rule));
      if (!applied) return false;
      // Both counters in one call (no variables to update).
      SHOAL_RETURN_IF_ERROR(
          client.ApplyGradients({}, {}, {{kGlobalStep, steps * workers}, {kAverageRound, 1}}).status());
    } else {
      SHOAL_ASSIGN_OR_RETURN(int64_t done, WaitForCounter(context, kAverageRound, round + 1, timeout,
                                                          absl::StrCat("averaging round ", round + 1)));
      if (done == 0) return false;  // stopped
    }
    SHOAL_RETURN_IF_ERROR(FetchGlobal(client, *replica));
    global_step += steps * workers;
    ++round;
    in_round = 0;
    info.global_step = global_step;
    info.exchanged = true;
    return FinishStep(context, info, &result);
  };
  // A lost ps: the chief restores the newest checkpoint, rounds and
  // accumulators included, and every worker starts that round again.
  SHOAL_RETURN_IF_ERROR(
      StepUntilDone(context, names, replica->model().variables(), block, step_once, join));
  return result;
}

// Elastic averaging SGD (Zhang et al., 2015; TensorFlow's
// ElasticAverageOptimizer): every tau steps, asynchronously, move the local
// copy and the ps's centre towards each other by alpha of their distance.
absl::StatusOr<WorkerResult> ElasticAverageStrategy::RunWorker(WorkerContext& context) {
  const LocalReplicaConfig& local = context.config->local;
  SHOAL_ASSIGN_OR_RETURN(auto replica, LocalReplica::Create(context.config->model, local.optimizer));
  SHOAL_RETURN_IF_ERROR(InitializeOrWait(context, replica->model()));
  const std::vector<std::string>& names = replica->names();
  const double alpha = local.alpha > 0 ? local.alpha : 0.9 / context.num_workers;
  SHOAL_RETURN_IF_ERROR(FetchGlobal(*context.client, *replica));
  std::vector<torch::Tensor> centre = replica->Values();  // the centre as last read, for the rho penalty
  BatchIterator batches = WorkerBatches(context);
  WorkerResult result;
  int64_t global_step = 0;
  int64_t step = 0;
  auto step_once = [&]() -> absl::StatusOr<bool> {
    if (context.before_step) context.before_step(step);
    BatchResult batch = ComputeGradients(replica->model(), batches);
    std::vector<torch::Tensor> gradients = replica->model().Gradients();
    if (local.rho > 0) {
      for (size_t i = 0; i < gradients.size(); ++i) {
        gradients[i] = gradients[i] + local.rho * (replica->model().variables()[i].detach() - centre[i]);
      }
    }
    replica->Apply(gradients);
    StepInfo info = MakeStepInfo(step + 1, global_step, batch, replica->model());
    bool last = false;
    if ((step + 1) % local.tau == 0) {
      SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> read, context.client->Read(names));
      for (auto& t : read) t = t.clone();  // in-process reads alias the centre, which the add below changes
      std::vector<torch::Tensor> x = replica->Values();
      std::vector<torch::Tensor> deltas;
      for (size_t i = 0; i < x.size(); ++i) deltas.push_back(alpha * (x[i] - read[i]));
      SHOAL_ASSIGN_OR_RETURN(Push push,
                             PushExchange(context, names, deltas, wire::UPDATE_ADD, local.tau, info, &result));
      if (!push.sent) return false;
      for (size_t i = 0; i < x.size(); ++i) x[i] -= deltas[i];
      // The elastic penalty's anchor is the centre as read at this exchange,
      // before this worker's own push, as TensorFlow's
      // ElasticAverageOptimizer keeps its local copy of the centre.
      centre = std::move(read);
      replica->Load(x);
      // Buffers have no elastic force: the replica adds its drift and takes the centre's.
      if (!replica->model().buffer_names().empty()) {
        SHOAL_RETURN_IF_ERROR(PushBufferDrift(context, *replica));
        SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> buffers,
                               context.client->Read(replica->model().buffer_names()));
        replica->model().LoadBuffers(buffers);
        replica->SettleBuffers();
      }
      global_step = info.global_step;
      last = push.last;
    }
    ++step;
    SHOAL_ASSIGN_OR_RETURN(bool go_on, FinishStep(context, info, &result));
    return go_on && !last;
  };
  // After a restore the centre went back to the checkpoint: start again
  // from it, as a worker joining the job does.
  auto rejoin = [&]() -> absl::Status {
    SHOAL_RETURN_IF_ERROR(FetchGlobal(*context.client, *replica));
    centre = replica->Values();
    return absl::OkStatus();
  };
  SHOAL_RETURN_IF_ERROR(StepUntilDone(context, names, replica->model().variables(),
                                      context.config->training.optimizer, step_once, rejoin));
  return result;
}

namespace {

// Each worker trains its own copy with the local optimizer; buffers follow
// the drift rule (PushBufferDrift), so the chief publishes none of its own.
class Downpour final : public TrainingMode {
 public:
  std::string name() const override { return "downpour"; }
  std::unique_ptr<TrainingStrategy> MakeStrategy() const override { return std::make_unique<DownpourStrategy>(); }
  // DistBelief's: adagrad on the ps.
  wire::OptimizerConfig DefaultOptimizer() const override {
    wire::OptimizerConfig o;
    o.set_kind("adagrad");
    o.set_learning_rate(0.01);
    return o;
  }
};

class ModelAverage final : public TrainingMode {
 public:
  std::string name() const override { return "model_average"; }
  std::unique_ptr<TrainingStrategy> MakeStrategy() const override {
    return std::make_unique<ModelAverageStrategy>();
  }
};

class ElasticAverage final : public TrainingMode {
 public:
  std::string name() const override { return "easgd"; }
  std::unique_ptr<TrainingStrategy> MakeStrategy() const override {
    return std::make_unique<ElasticAverageStrategy>();
  }
};

}  // namespace

const TrainingMode& DownpourMode() {
  static const Downpour mode;
  return mode;
}

const TrainingMode& ModelAverageMode() {
  static const ModelAverage mode;
  return mode;
}

const TrainingMode& ElasticAverageMode() {
  static const ElasticAverage mode;
  return mode;
}

}  // namespace shoal
