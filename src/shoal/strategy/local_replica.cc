#include "shoal/strategy/local_replica.h"

#include "shoal/core/status.h"
#include "shoal/strategy/leased_data.h"
#include "shoal/strategy/step_driver.h"

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

absl::Status PushBufferDrift(WorkerContext& context, LocalReplica& replica,
                             std::vector<torch::Tensor>* buffers_after) {
  const std::vector<std::string>& names = replica.model().buffer_names();
  if (names.empty()) return absl::OkStatus();
  const std::vector<torch::Tensor> drift = replica.BufferDrift(context.num_workers);
  if (buffers_after == nullptr) {
    SHOAL_RETURN_IF_ERROR(context.client->AddToVariables(names, drift).status());
  } else {
    SHOAL_ASSIGN_OR_RETURN(Client::AppliedValues added, context.client->AddToVariablesAndRead(names, drift));
    *buffers_after = std::move(added.values);
  }
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

// Sends `update` (gradients for the ps's optimizer, or the worker's copies
// to move the centre towards by `elastic_alpha`), advancing
// global_step by `steps`. With `values` (gradients: optional; elastic:
// required) the answer also brings the variables' values: right after a
// gradients' apply, so that a fetch due next needs no round trip of its
// own; right before an elastic move. True when that was the job's last: it
// is stopped or has reached max_steps. On leased data the update carries
// the places of its local steps (WorkerContext::step_progress).
absl::StatusOr<bool> PushExchange(WorkerContext& context, const std::vector<std::string>& names,
                                  const std::vector<torch::Tensor>& update, wire::UpdateRule rule, int64_t steps,
                                  StepInfo& info, std::vector<torch::Tensor>* values_after = nullptr,
                                  double elastic_alpha = 0) {
  const std::vector<CounterDelta> counters = {{kGlobalStep, steps}, {kStopRequested, 0}, TakeDataPosition(context)};
  const wire::DataProgress* progress = context.leased_data != nullptr ? context.step_progress : nullptr;
  wire::ProgressAnswer* answer = progress != nullptr ? &context.step_answer : nullptr;
  std::vector<int64_t> values;
  if (rule == wire::UPDATE_ELASTIC) {
    SHOAL_ASSIGN_OR_RETURN(Client::AppliedValues moved,
                           context.client->MoveTowards(names, update, elastic_alpha, counters, progress, answer));
    values = std::move(moved.counters);
    *values_after = std::move(moved.values);
  } else if (values_after == nullptr) {
    SHOAL_ASSIGN_OR_RETURN(values, context.client->ApplyGradients(names, update, counters, progress, answer));
  } else {
    SHOAL_ASSIGN_OR_RETURN(Client::AppliedValues applied,
                           context.client->ApplyGradientsAndRead(names, update, counters, progress, answer));
    values = std::move(applied.counters);
    *values_after = std::move(applied.values);
  }
  info.global_step = values[0];
  info.exchanged = true;
  return values[1] > 0 || values[0] >= context.max_steps;
}

std::vector<torch::Tensor> ZerosLike(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> zeros;
  for (const auto& t : tensors) zeros.push_back(torch::zeros_like(t));
  return zeros;
}

// What the three local-replica policies share: the worker trains its own
// copy with the local optimizer, and its buffers follow the drift rule
// (PushBufferDrift), so the chief publishes none of its own.
class LocalReplicaPolicy : public StepPolicy {
 public:
  explicit LocalReplicaPolicy(WorkerContext& context)
      : context_(context), client_(*context.client), local_(context.config->local) {}
  absl::StatusOr<Model*> Start(WorkerContext& context) override {
    SHOAL_ASSIGN_OR_RETURN(replica_, LocalReplica::Create(context.config->model, local_.optimizer));
    return &replica_->model();
  }
  bool ChiefPublishesBuffers() const override { return false; }
  // Only an exchange sends: on leased data it carries its local steps' places.
  bool SendsEveryStep() const override { return false; }
  int64_t LocalStep() const override { return step_; }
  int64_t GlobalStep() const override { return global_step_; }

 protected:
  WorkerContext& context_;
  Client& client_;
  const LocalReplicaConfig& local_;
  std::unique_ptr<LocalReplica> replica_;
  int64_t step_ = 0;         // local steps taken
  int64_t global_step_ = 0;  // as the last exchange left it

  LeasedData* leased() const { return context_.leased_data.get(); }
  // The local step just taken: whether the exchange is due, every `every`
  // steps or, on leased data, at its shard's end or a cut (one update's
  // places lie in one shard and straddle no task's restored watermark).
  bool ExchangeDueAfterStep(int64_t every) {
    ++unsent_;
    return (step_ + 1) % every == 0 || (leased() != nullptr && leased()->UpdateMustGo());
  }
  // The local steps the exchange being sent counts into global_step: on
  // leased data those since the last exchange, else `every`.
  int64_t TakeUnsentSteps(int64_t every) {
    const int64_t steps = leased() != nullptr ? unsent_ : every;
    unsent_ = 0;
    return steps;
  }
  // The local steps since the last exchange are thrown away with the copy
  // (a restore): on leased data their places are trained again.
  void DropUnsentSteps() {
    unsent_ = 0;
    if (leased() != nullptr) leased()->DropLocal();
  }

 private:
  int64_t unsent_ = 0;  // local steps since the last exchange
};

// Downpour (Dean et al., 2012): fetch every n_fetch steps, train locally, and
// push the summed gradients every n_push steps for the ps's optimizer. A
// push right before a fetch (every push when n_fetch == n_push) brings the
// values back in its answer, as async's pushes do: one round trip, not two.
// On leased data a push carries its steps' places (one range of one shard:
// a push comes early when its shard ends), and one refused (its lease ran
// out) applies none of its gradients.
class DownpourPolicy : public LocalReplicaPolicy {
 public:
  using LocalReplicaPolicy::LocalReplicaPolicy;
  // After a restore: the restored values, and no gradients from before it.
  // (At the start the first step fetches.)
  absl::Status Join(Model& model) override {
    pending_ = ZerosLike(model.variables());
    DropUnsentSteps();  // with the gradients not pushed
    pushed_values_.clear();
    pushed_buffers_.clear();
    if (!joined_) {
      joined_ = true;
      return absl::OkStatus();
    }
    return FetchGlobal(client_, *replica_);
  }
  bool HasStepsLeft() const override { return !done_; }
  absl::Status Pull(Model& /*model*/) override {
    if (step_ % local_.n_fetch != 0) return absl::OkStatus();
    if (pushed_values_.empty()) return FetchGlobal(client_, *replica_);
    replica_->Load(pushed_values_);
    if (!pushed_buffers_.empty()) replica_->TakeGlobalBuffers(pushed_buffers_);
    pushed_values_.clear();
    pushed_buffers_.clear();
    return absl::OkStatus();
  }
  absl::StatusOr<PushOutcome> Push(Model& model, const std::vector<torch::Tensor>& gradients, StepInfo& step,
                                   const UpdateCheck& check) override {
    for (size_t i = 0; i < gradients.size(); ++i) pending_[i].add_(gradients[i]);
    replica_->Apply(gradients);
    step.local_step = step_ + 1;
    if (ExchangeDueAfterStep(local_.n_push)) {
      SHOAL_ASSIGN_OR_RETURN(bool send, check(model.variable_names(), pending_));
      if (!send) return PushOutcome::kStopped;
      // Buffers' drift goes in after the push; before a fetch each call
      // brings its values back.
      const bool fetch_next = (step_ + 1) % local_.n_fetch == 0;
      SHOAL_ASSIGN_OR_RETURN(bool last, PushExchange(context_, model.variable_names(), pending_,
                                                     wire::UPDATE_OPTIMIZER, TakeUnsentSteps(local_.n_push),
                                                     step, fetch_next ? &pushed_values_ : nullptr));
      SHOAL_RETURN_IF_ERROR(PushBufferDrift(context_, *replica_, fetch_next ? &pushed_buffers_ : nullptr));
      for (auto& p : pending_) p.zero_();
      global_step_ = step.global_step;
      done_ = last;
    }
    ++step_;
    return done_ ? PushOutcome::kLastStep : PushOutcome::kStepDone;
  }

 private:
  std::vector<torch::Tensor> pending_;  // gradients not yet pushed
  std::vector<torch::Tensor> pushed_values_;   // the last push's answer, for the fetch right after it
  std::vector<torch::Tensor> pushed_buffers_;  // and its buffers' (a model with buffers)
  bool joined_ = false;
  bool done_ = false;
};

// Model averaging (TensorFlow's ModelAverageOptimizer; BMUF with block
// momentum): train locally, and at the end of every round average the local
// copies at a barrier through the ps's accumulators; everyone continues from
// the average.
//
// On leased data (LeasedData) a round's batches are one range of one shard,
// and the copy carries their places: the round ends early when its shard
// does. A copy taken into the round's accumulators has its places applied;
// one dropped (its round was averaged without it) or refused (its lease ran
// out) has none, and they are trained again. The round averages the copies
// of the workers holding a live lease, and any worker waiting for it
// applies it, so no one worker (not even the chief, which may be waiting for
// a free shard) holds the others up. global_step counts every copy's local
// steps.
class ModelAveragePolicy : public LocalReplicaPolicy {
 public:
  explicit ModelAveragePolicy(WorkerContext& context)
      : LocalReplicaPolicy(context),
        workers_(context.num_workers),
        rounds_(AveragingRounds(local_, context.max_steps, workers_)),
        timeout_(absl::Seconds(context.config->training.sync_timeout_s)) {}

  absl::StatusOr<Model*> Start(WorkerContext& context) override {
    // A restore puts the rounds, and the accumulators that average them, at
    // the round the checkpoint's step ends.
    context.restore_accumulator_step = [this](int64_t global_step) -> absl::StatusOr<int64_t> {
      const int64_t round = RoundAtLocalStep(local_, global_step / workers_);
      SHOAL_RETURN_IF_ERROR(client_.SetCounter(kAverageRound, round).status());
      return round;
    };
    return LocalReplicaPolicy::Start(context);
  }
  // With block momentum the global copy keeps BMUF's bg as a momentum slot:
  // momentum SGD on (global - average) is exactly bg = m*bg + lr*(global - average).
  wire::OptimizerConfig PsOptimizer(const WorkerContext& /*context*/) const override {
    wire::OptimizerConfig block;
    block.set_kind("momentum");
    block.set_learning_rate(local_.block_learning_rate);
    block.set_momentum(local_.block_momentum);
    return block;
  }
  // At the start (a restarted worker joins the round in progress) and after
  // a restore: from the global copy, at the start of the job's round.
  absl::Status Join(Model& model) override {
    in_round_ = 0;
    if (leased() != nullptr) {
      DropUnsentSteps();  // the local copy's steps are thrown away
      return FetchRound(model);
    }
    SHOAL_ASSIGN_OR_RETURN(round_, client_.AddToCounter(kAverageRound, 0));
    step_ = 0;
    for (int64_t r = 0; r < round_; ++r) step_ += LocalStepsInRound(local_, r);
    global_step_ = step_ * workers_;
    return FetchGlobal(client_, *replica_);
  }
  bool HasStepsLeft() const override {
    return leased() != nullptr ? global_step_ < context_.max_steps : round_ < rounds_;
  }
  absl::Status Pull(Model& /*model*/) override { return absl::OkStatus(); }  // the local copy trains on
  absl::StatusOr<PushOutcome> Push(Model& model, const std::vector<torch::Tensor>& gradients, StepInfo& step,
                                   const UpdateCheck& check) override {
    const int64_t steps = LocalStepsInRound(local_, round_);
    replica_->Apply(gradients);
    step.local_step = ++step_;
    step.global_step = global_step_;
    const bool must_go = leased() != nullptr && leased()->UpdateMustGo();
    if (++in_round_ < steps && !must_go) return PushOutcome::kStepDone;
    // The round's last step: average.
    const std::vector<std::string>& names = model.variable_names();
    const std::vector<torch::Tensor> values = replica_->Values();
    SHOAL_ASSIGN_OR_RETURN(bool send, check(names, values));
    if (!send) return PushOutcome::kStopped;
    // The buffers' drift first: all of it is in before the barrier releases anyone.
    SHOAL_RETURN_IF_ERROR(PushBufferDrift(context_, *replica_));
    const wire::AccumulatedRule rule = local_.block_momentum > 0 ? wire::BLOCK_MOMENTUM : wire::ASSIGN_MEAN;
    if (leased() != nullptr) return AverageLiveCopies(model, values, rule, step);
    // A worker's place in its data rides with its copy; the chief's with the
    // counters that end the round.
    std::vector<CounterDelta> counters;
    if (!context_.is_chief) counters.push_back(TakeDataPosition(context_));
    SHOAL_RETURN_IF_ERROR(
        client_.Accumulate(names, values, round_, context_.task.ToString(), /*apply_at=*/0, counters).status());
    if (context_.is_chief) {
      SHOAL_ASSIGN_OR_RETURN(bool applied, ApplyAccumulatedOrStop(context_, names, workers_, round_ + 1, rule));
      if (!applied) return PushOutcome::kStopped;
      // The counters in one call (no variables to update).
      SHOAL_RETURN_IF_ERROR(
          client_
              .AddToCounters({{kGlobalStep, steps * workers_}, {kAverageRound, 1}, TakeDataPosition(context_)})
              .status());
    } else {
      SHOAL_ASSIGN_OR_RETURN(int64_t done, WaitForCounter(context_, kAverageRound, round_ + 1, timeout_,
                                                          absl::StrCat("averaging round ", round_ + 1)));
      if (done == 0) return PushOutcome::kStopped;
    }
    SHOAL_RETURN_IF_ERROR(FetchGlobal(client_, *replica_));
    global_step_ += steps * workers_;
    ++round_;
    in_round_ = 0;
    step.global_step = global_step_;
    step.exchanged = true;
    return PushOutcome::kStepDone;
  }

 private:
  // Leased data: the copy and its places go into the round's accumulators
  // (counting its local steps into global_step); the round is averaged over
  // the live workers' copies, by whichever waiting worker sees them all in;
  // then the replica trains on from the average, in the round the
  // accumulators are at (ahead of this one's, when its copy came too late).
  absl::StatusOr<PushOutcome> AverageLiveCopies(Model& model, const std::vector<torch::Tensor>& values,
                                                wire::AccumulatedRule rule, StepInfo& step) {
    const std::vector<std::string>& names = model.variable_names();
    SHOAL_ASSIGN_OR_RETURN(const int dropped, client_.Accumulate(names, values, round_, context_.task.ToString(),
                                                                 /*apply_at=*/0, {{kGlobalStep, in_round_}},
                                                                 context_.step_progress, &context_.step_answer));
    // A copy taken nowhere (its lease ran out) has no round to wait for.
    if (dropped < static_cast<int>(names.size())) {
      auto live = [this]() -> absl::StatusOr<int> {
        SHOAL_ASSIGN_OR_RETURN(const int64_t holders, leased()->AskLiveWorkers());
        return static_cast<int>(std::max<int64_t>(1, holders));
      };
      SHOAL_ASSIGN_OR_RETURN(bool applied, ApplyAccumulatedOrStop(context_, names, 1, round_ + 1, rule, live));
      if (!applied) return PushOutcome::kStopped;
    }
    SHOAL_RETURN_IF_ERROR(FetchRound(model));
    in_round_ = 0;
    step.global_step = global_step_;
    step.exchanged = true;
    return PushOutcome::kStepDone;
  }

  // Leased data: the global copy, the round its accumulators are at, and
  // the job's global_step.
  absl::Status FetchRound(Model& model) {
    // Not every accumulator past round 0: the job is in round 0.
    SHOAL_ASSIGN_OR_RETURN(Client::StepValues at,
                           client_.ReadAtStep(model.variable_names(), 1, absl::Milliseconds(1)));
    if (!at.ready) {
      SHOAL_ASSIGN_OR_RETURN(at.values, client_.Read(model.variable_names()));
    }
    round_ = at.ready ? at.step : 0;
    replica_->Load(at.values);
    if (!model.buffer_names().empty()) {
      SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> buffers, client_.Read(model.buffer_names()));
      replica_->TakeGlobalBuffers(buffers);
    }
    SHOAL_ASSIGN_OR_RETURN(global_step_, client_.AddToCounter(kGlobalStep, 0));
    return absl::OkStatus();
  }

  const int workers_;
  const int64_t rounds_;  // without leased data: the rounds of the job
  const absl::Duration timeout_;
  int64_t round_ = 0;     // the averaging round in progress
  int64_t in_round_ = 0;  // local steps taken in it
};

// Elastic averaging SGD (Zhang et al., 2015; TensorFlow's
// ElasticAverageOptimizer): every tau steps, asynchronously, move the local
// copy and the ps's centre towards each other by alpha of their distance.
//
// On leased data a move carries the places of its local steps (one range of
// one shard: a move comes early when its shard ends). The copy holds every
// step it took, so a move a task did not take (its places were applied
// already, or the lease ran out) would still bring those steps to the
// centre through later moves: the copy starts again from the centre instead,
// and the places are trained again (by this worker, or the shard's new
// holder).
class ElasticAveragePolicy : public LocalReplicaPolicy {
 public:
  explicit ElasticAveragePolicy(WorkerContext& context)
      : LocalReplicaPolicy(context), alpha_(local_.alpha > 0 ? local_.alpha : 0.9 / context.num_workers) {}
  // At the start, and after a restore took the centre back to the
  // checkpoint: from the centre.
  absl::Status Join(Model& /*model*/) override {
    DropUnsentSteps();  // the steps since the last move are gone with the copy
    return StartFromCentre();
  }
  bool HasStepsLeft() const override { return !done_; }
  absl::Status Pull(Model& /*model*/) override { return absl::OkStatus(); }  // the local copy trains on
  absl::StatusOr<PushOutcome> Push(Model& model, const std::vector<torch::Tensor>& gradients, StepInfo& step,
                                   const UpdateCheck& check) override {
    std::vector<torch::Tensor> penalised = gradients;
    if (local_.rho > 0) {
      for (size_t i = 0; i < penalised.size(); ++i) {
        penalised[i] = penalised[i] + local_.rho * (model.variables()[i].detach() - centre_[i]);
      }
    }
    replica_->Apply(penalised);
    step.local_step = step_ + 1;
    if (ExchangeDueAfterStep(local_.tau)) {
      SHOAL_ASSIGN_OR_RETURN(bool exchanged, Exchange(model, step, check));
      if (!exchanged) return PushOutcome::kStopped;
    }
    ++step_;
    return done_ ? PushOutcome::kLastStep : PushOutcome::kStepDone;
  }

 private:
  absl::Status StartFromCentre() {
    SHOAL_RETURN_IF_ERROR(FetchGlobal(client_, *replica_));
    centre_ = replica_->Values();  // the centre as last read, for the rho penalty
    return absl::OkStatus();
  }

  // d = alpha * (x - centre); x -= d; centre += d, in one round trip: the ps
  // moves the centre and answers with it as it was, so no other worker's
  // exchange lands between the read and the move. False: a hook stopped it.
  absl::StatusOr<bool> Exchange(Model& model, StepInfo& step, const UpdateCheck& check) {
    const std::vector<std::string>& names = model.variable_names();
    std::vector<torch::Tensor> x = replica_->Values();
    SHOAL_ASSIGN_OR_RETURN(bool send, check(names, x));
    if (!send) return false;
    std::vector<torch::Tensor> centre;
    SHOAL_ASSIGN_OR_RETURN(bool last, PushExchange(context_, names, x, wire::UPDATE_ELASTIC,
                                                   TakeUnsentSteps(local_.tau), step, &centre, alpha_));
    global_step_ = step.global_step;
    done_ = last;
    if (leased() != nullptr && !context_.step_answer.applied()) {
      // Some task did not take the move (its places were applied there
      // already, or the lease ran out): the copy must not carry these
      // steps into later moves, so it starts again from the centre, which
      // holds what the tasks that took the move have of it.
      SHOAL_RETURN_IF_ERROR(StartFromCentre());
      return true;
    }
    for (size_t i = 0; i < x.size(); ++i) x[i] -= (x[i] - centre[i]) * alpha_;  // the ps's own expression
    // The elastic penalty's anchor is the centre as it was at this exchange,
    // before this worker's own move, as TensorFlow's
    // ElasticAverageOptimizer keeps its local copy of the centre.
    centre_ = std::move(centre);
    replica_->Load(x);
    // Buffers have no elastic force: the replica adds its drift and takes
    // the centre's, in one call.
    if (!model.buffer_names().empty()) {
      std::vector<torch::Tensor> buffers;
      SHOAL_RETURN_IF_ERROR(PushBufferDrift(context_, *replica_, &buffers));
      replica_->TakeGlobalBuffers(buffers);
    }
    return true;
  }

  const double alpha_;
  std::vector<torch::Tensor> centre_;
  bool done_ = false;
};

}  // namespace

absl::StatusOr<WorkerResult> DownpourStrategy::RunWorker(WorkerContext& context) {
  DownpourPolicy policy(context);
  return DriveSteps(context, policy);
}

absl::StatusOr<WorkerResult> ModelAverageStrategy::RunWorker(WorkerContext& context) {
  ModelAveragePolicy policy(context);
  return DriveSteps(context, policy);
}

absl::StatusOr<WorkerResult> ElasticAverageStrategy::RunWorker(WorkerContext& context) {
  ElasticAveragePolicy policy(context);
  return DriveSteps(context, policy);
}

namespace {

// Each worker trains its own copy with the local optimizer; buffers follow
// the drift rule (PushBufferDrift), so the chief publishes none of its own.
class Downpour final : public TrainingMode {
 public:
  std::string name() const override { return "downpour"; }
  bool LeasesData() const override { return true; }
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
  bool LeasesData() const override { return true; }
  bool CheckpointsHoldOneStep() const override { return true; }
  std::unique_ptr<TrainingStrategy> MakeStrategy() const override {
    return std::make_unique<ModelAverageStrategy>();
  }
};

class ElasticAverage final : public TrainingMode {
 public:
  std::string name() const override { return "easgd"; }
  bool LeasesData() const override { return true; }
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
