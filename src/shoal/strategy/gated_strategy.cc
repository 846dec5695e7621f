#include "shoal/strategy/gated_strategy.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

// Counters (on the counter task) that pace a lockstep step t: each reaches
// t + 1 when its part of step t is done.
constexpr char kBatchCounter[] = "gated_batch";    // the chief has published batch t
constexpr char kScalesCounter[] = "gated_scales";  // the chief has sent every network its scales
std::string LogitsCounter(int k) { return absl::StrCat("gated_logits/", k); }  // network k's logits are in

// Exchange tensors, on the chief. A batch is [n, index_0 .. index_{n-1}],
// padded to batch_size + 1 (the last batch of an epoch is smaller); the
// per-network tensors are padded to batch_size rows the same way. Indices
// are exact in float32 below 2^24 examples.
constexpr char kBatchVariable[] = "exchange/batch";
std::string LogitsVariable(int k) { return absl::StrCat("exchange/logits_", k); }
std::string ScaleVariable(int k) { return absl::StrCat("exchange/scale_", k); }
std::string LogitGradVariable(int k) { return absl::StrCat("exchange/logit_grad_", k); }
constexpr int64_t kMaxExamples = int64_t{1} << 24;

std::vector<VariableSpec> ExchangeSpecs(const GatedModelConfig& gated, int64_t batch_size, int64_t classes) {
  std::vector<VariableSpec> specs = {{kBatchVariable, {batch_size + 1}}};
  for (size_t k = 1; k < gated.networks.size(); ++k) {
    specs.push_back({LogitsVariable(k), {batch_size, classes}});
    specs.push_back({ScaleVariable(k), {batch_size}});
    if (gated.master_loss_to_workers) specs.push_back({LogitGradVariable(k), {batch_size, classes}});
  }
  return specs;
}

// The chief draws a batch a lockstep step: puts `batches` where step `t`
// of the job draws, counted from the step its training data began at.
absl::Status SeekToStep(Client& client, int64_t t, BatchIterator& batches) {
  SHOAL_ASSIGN_OR_RETURN(const int64_t data_start, client.AddToCounter(kDataStartStep, 0));
  batches.SeekTo(batches.ExamplesInBatches(std::max<int64_t>(0, t - data_start)));
  return absl::OkStatus();
}

torch::Tensor PadRows(const torch::Tensor& t, int64_t rows) {
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  shape[0] = rows;
  torch::Tensor padded = torch::zeros(shape);
  padded.narrow(0, 0, t.size(0)).copy_(t);
  return padded;
}

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<torch::Tensor> Concat(std::vector<torch::Tensor> a, const std::vector<torch::Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void ZeroGradients(const Model* part) {
  if (part == nullptr) return;
  for (const auto& p : part->variables()) p.mutable_grad().reset();
}

// One step of lockstep training from network k's task (the chief also runs
// the master).
class LockstepWorker {
 public:
  LockstepWorker(WorkerContext& context, GatedEnsemble& ensemble)
      : context_(context),
        client_(*context.client),
        ensemble_(ensemble),
        k_(context.worker_index),
        network_(ensemble.network(k_)),
        trunk_(ensemble.trunk()),
        batch_size_(context.config->training.batch_size),
        timeout_(absl::Seconds(context.config->training.sync_timeout_s)),
        // The chief knows which network is missing: it should be the first
        // to give up, and tell the others (job_aborted).
        chief_timeout_(2 * timeout_),
        me_(context.task.ToString()) {
    own_names_ = network_.variable_names();
    own_buffers_ = {&network_};
    pulled_parts_ = {&network_};
    if (trunk_) {
      trunk_names_ = trunk_->variable_names();
      pulled_parts_.push_back(trunk_);
    }
    if (context.is_chief) {
      pulled_parts_.push_back(&ensemble.master());
      own_buffers_.push_back(&ensemble.master());
    }
    for (const Model* part : own_buffers_) own_buffer_names_ = Concat(own_buffer_names_, part->buffer_names());
    for (const Model* part : pulled_parts_) pulled_names_ = Concat(pulled_names_, part->variable_names());
  }

  // Runs the whole job from this task; `names` and `values` are every
  // variable of the job, for a restore.
  absl::StatusOr<WorkerResult> Run(const std::vector<std::string>& names, const std::vector<torch::Tensor>& values) {
    std::optional<BatchIterator> batches;
    if (context_.is_chief) batches.emplace(GatedBatchIndices(context_.train_shard, *context_.config));
    WorkerResult result;
    // The job's step: at the start (a restarted network joins the step the
    // chief waits in) and after a restore, which put every counter there.
    // The chief draws a batch a step, so the step says where its data stands.
    SHOAL_ASSIGN_OR_RETURN(int64_t t, client_.AddToCounter(kGlobalStep, 0));
    if (batches) SHOAL_RETURN_IF_ERROR(SeekToStep(*context_.client, t, *batches));
    SHOAL_RETURN_IF_ERROR(StepUntilDone(
        context_,
        [&]() -> absl::StatusOr<bool> {
          if (t >= context_.max_steps) return false;
          SHOAL_ASSIGN_OR_RETURN(bool go_on, Step(t, batches ? &*batches : nullptr, &result));
          ++t;
          return go_on;
        },
        [&](const absl::Status& error) -> absl::Status {
          const int64_t restores = context_.restores_known;
          SHOAL_RETURN_IF_ERROR(
              RecoverLostVariables(context_, names, values, context_.config->training.optimizer, error));
          SHOAL_RETURN_IF_ERROR(NoteJobState(context_));
          // Half a lockstep step cannot be taken again (its counters have
          // moved): only a restore, which puts them back, lets the job go on.
          if (context_.restores_known == restores) return error;
          SHOAL_ASSIGN_OR_RETURN(t, client_.AddToCounter(kGlobalStep, 0));
          if (batches) SHOAL_RETURN_IF_ERROR(SeekToStep(*context_.client, t, *batches));
          return absl::OkStatus();
        }));
    return result;
  }

 private:
  absl::StatusOr<bool> Step(int64_t t, BatchIterator* batches, WorkerResult* result) {
    torch::Tensor images, labels;
    SHOAL_ASSIGN_OR_RETURN(bool have_batch, batches ? PublishBatch(t, *batches, &images, &labels)
                                                    : ReceiveBatch(t, &images, &labels));
    if (!have_batch) return false;
    SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> values, client_.Read(pulled_names_));
    auto next = values.begin();
    for (Model* part : pulled_parts_) {
      part->Load({next, next + part->variables().size()});
      next += part->variables().size();
    }
    ZeroGradients(trunk_);
    ZeroGradients(&network_);
    const torch::Tensor logits = ensemble_.NetworkLogits(k_, images);

    torch::Tensor scale, logit_grad;
    SHOAL_ASSIGN_OR_RETURN(bool have_scales, context_.is_chief
                                                 ? RunMaster(t, logits, images, labels, &scale, &logit_grad)
                                                 : ExchangeLogits(t, logits, &scale, &logit_grad));
    if (!have_scales) return false;
    return ApplyScaledGradients(t, logits, labels, scale, logit_grad, result);
  }

  // The network's backward under its scales, its update through the ps (and
  // on the chief the trunk's summed update), and the step's hooks.
  absl::StatusOr<bool> ApplyScaledGradients(int64_t t, const torch::Tensor& logits, const torch::Tensor& labels,
                                            const torch::Tensor& scale, const torch::Tensor& logit_grad,
                                            WorkerResult* result) {
    torch::Tensor loss = ScaledNetworkLoss(logits, labels, scale);
    if (logit_grad.defined()) loss = loss + (logits * logit_grad).sum();
    loss.backward();
    BatchResult batch;
    {
      torch::NoGradGuard no_grad;
      batch.loss = CrossEntropyLoss(logits, labels).item<double>();
      batch.accuracy = logits.argmax(1).eq(labels).to(torch::kFloat64).mean().item<double>();
      batch.examples = labels.size(0);
    }
    StepInfo info = MakeStepInfo(result->local_steps + 1, t + 1, batch, network_);
    const std::vector<torch::Tensor> own = network_.Gradients();
    const std::vector<torch::Tensor> shared = trunk_ ? trunk_->Gradients() : std::vector<torch::Tensor>{};
    SHOAL_ASSIGN_OR_RETURN(bool send, CheckUpdate(context_, Concat(own_names_, trunk_names_), Concat(own, shared), info, result));
    if (!send) return false;
    SHOAL_RETURN_IF_ERROR(client_.ApplyGradients(own_names_, own).status());
    if (trunk_) {
      SHOAL_ASSIGN_OR_RETURN(int dropped, client_.Accumulate(trunk_names_, shared, t, me_));
      if (dropped > 0) {
        SHOAL_RETURN_IF_ERROR(JobRewound(context_));  // a restore took the job back past step t
        return absl::InternalError(absl::StrCat(me_, ": the ps dropped its trunk gradient of step ", t,
                                                " as stale; the lockstep is broken"));
      }
    }
    if (context_.is_chief) {
      if (trunk_) {
        // The trunk's gradients of all networks, summed, before the next batch.
        SHOAL_ASSIGN_OR_RETURN(bool applied, ApplyAccumulatedOrStop(context_, trunk_names_, ensemble_.num_networks(),
                                                                    t + 1, wire::SUM_GRADIENT));
        if (!applied) return false;
      }
      SHOAL_RETURN_IF_ERROR(client_.AddToCounter(kGlobalStep, 1).status());
    }
    SHOAL_RETURN_IF_ERROR(PublishBuffersIfDue(context_, info, own_buffer_names_, [&] {
      std::vector<torch::Tensor> values;
      for (const Model* part : own_buffers_) values = Concat(values, part->BufferValues());
      return values;
    }));
    return FinishStep(context_, info, result);
  }

  absl::StatusOr<bool> PublishBatch(int64_t t, BatchIterator& batches, torch::Tensor* images, torch::Tensor* labels) {
    torch::Tensor index_rows;
    batches.Next(&index_rows, labels);
    const torch::Tensor indices = index_rows.squeeze(1).to(torch::kInt64);
    *images = context_.train_shard.images.index_select(0, indices);
    torch::Tensor published = torch::zeros({batch_size_ + 1});
    published[0] = static_cast<float>(indices.size(0));
    published.narrow(0, 1, indices.size(0)).copy_(indices);
    SHOAL_RETURN_IF_ERROR(client_.Assign({kBatchVariable}, {published}));
    SHOAL_RETURN_IF_ERROR(client_.AddToCounter(kBatchCounter, 1).status());
    return true;
  }

  absl::StatusOr<bool> ReceiveBatch(int64_t t, torch::Tensor* images, torch::Tensor* labels) {
    SHOAL_ASSIGN_OR_RETURN(int64_t published, WaitForCounter(context_, kBatchCounter, t + 1, chief_timeout_,
                                                             absl::StrCat("the batch of step ", t)));
    if (published == 0) return false;  // stopped
    SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> batch, client_.Read({kBatchVariable}));
    const int64_t n = static_cast<int64_t>(batch[0][0].item<float>());
    if (n < 1 || n > batch_size_) {
      return absl::DataLossError(absl::StrCat(me_, ": the chief's batch of step ", t, " claims ", n, " examples"));
    }
    const torch::Tensor indices = batch[0].narrow(0, 1, n).to(torch::kInt64);
    if (indices.min().item<int64_t>() < 0 || indices.max().item<int64_t>() >= context_.train_shard.size()) {
      return absl::DataLossError(absl::StrCat(me_, ": the chief's batch of step ", t, " names examples outside the ",
                                              context_.train_shard.size(), " of the training set"));
    }
    *images = context_.train_shard.images.index_select(0, indices);
    *labels = context_.train_shard.labels.index_select(0, indices);
    return true;
  }

  // A worker task: sends its logits, then waits for its scale.
  absl::StatusOr<bool> ExchangeLogits(int64_t t, const torch::Tensor& logits, torch::Tensor* scale,
                                      torch::Tensor* logit_grad) {
    SHOAL_RETURN_IF_ERROR(client_.Assign({LogitsVariable(k_)}, {PadRows(logits.detach(), batch_size_)}));
    SHOAL_RETURN_IF_ERROR(client_.AddToCounter(LogitsCounter(k_), 1).status());
    SHOAL_ASSIGN_OR_RETURN(int64_t sent, WaitForCounter(context_, kScalesCounter, t + 1, chief_timeout_,
                                                        absl::StrCat("the master's scales of step ", t)));
    if (sent == 0) return false;
    std::vector<std::string> names = {ScaleVariable(k_)};
    if (ensemble_.config().master_loss_to_workers) names.push_back(LogitGradVariable(k_));
    SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> received, client_.Read(names));
    const int64_t n = logits.size(0);
    *scale = received[0].narrow(0, 0, n).clone();
    if (received.size() > 1) *logit_grad = received[1].narrow(0, 0, n).clone();
    return true;
  }

  // The chief: gathers every network's logits, trains the master on them and
  // sends each network its scales; returns network 0's (its own).
  absl::StatusOr<bool> RunMaster(int64_t t, const torch::Tensor& own_logits, const torch::Tensor& images,
                                 const torch::Tensor& labels, torch::Tensor* scale, torch::Tensor* logit_grad) {
    const GatedModelConfig& gated = ensemble_.config();
    const int networks = ensemble_.num_networks();
    const int64_t n = own_logits.size(0);
    std::vector<torch::Tensor> inputs = {own_logits.detach()};
    for (int k = 1; k < networks; ++k) {
      SHOAL_ASSIGN_OR_RETURN(int64_t in, WaitForCounter(context_, LogitsCounter(k), t + 1, timeout_,
                                                        absl::StrCat("the logits of step ", t), &context_.workers[k]));
      if (in == 0) return false;
      SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> logits, client_.Read({LogitsVariable(k)}));
      inputs.push_back(logits[0].narrow(0, 0, n).clone());
    }
    // The master's loss reaches the networks only through these leaves, and
    // only when master_loss_to_workers asks for it.
    for (auto& input : inputs) input.requires_grad_(gated.master_loss_to_workers);
    Model& master = ensemble_.master();
    ZeroGradients(&master);
    const torch::Tensor weights = ensemble_.MasterWeights(inputs, images);
    torch::Tensor master_loss = MasterLoss(weights, Correctness(inputs, labels), gated.master_loss);
    master_loss.backward();
    const std::vector<torch::Tensor> master_gradients = master.Gradients();
    BatchResult batch;  // no accuracy or AUC of the master's own
    batch.loss = master_loss.item<double>();
    batch.examples = n;
    StepInfo info = MakeStepInfo(t + 1, t, batch, master);
    const torch::Tensor mean_weights = weights.detach().mean(0);
    for (int k = 0; k < networks; ++k) {
      info.scalars.emplace_back(absl::StrCat("gated/weight_", k), mean_weights[k].item<double>());
    }
    WorkerResult unused;
    SHOAL_ASSIGN_OR_RETURN(bool send, CheckUpdate(context_, master.variable_names(), master_gradients, info, &unused));
    if (!send) return false;
    SHOAL_RETURN_IF_ERROR(client_.ApplyGradients(master.variable_names(), master_gradients).status());

    const torch::Tensor scales = NetworkScales(weights, gated.scale);
    std::vector<std::string> names;
    std::vector<torch::Tensor> values;
    for (int k = 1; k < networks; ++k) {
      names.push_back(ScaleVariable(k));
      values.push_back(PadRows(scales.select(1, k), batch_size_));
      if (gated.master_loss_to_workers) {
        names.push_back(LogitGradVariable(k));
        values.push_back(PadRows(inputs[k].grad(), batch_size_));
      }
    }
    SHOAL_RETURN_IF_ERROR(client_.Assign(names, values));
    SHOAL_RETURN_IF_ERROR(client_.AddToCounter(kScalesCounter, 1).status());
    *scale = scales.select(1, 0);
    if (gated.master_loss_to_workers) *logit_grad = inputs[0].grad();
    return true;
  }

  WorkerContext& context_;
  Client& client_;
  GatedEnsemble& ensemble_;
  const int k_;
  Model& network_;
  Mlp* trunk_;
  const int64_t batch_size_;
  const absl::Duration timeout_;        // the chief's wait for a network's logits
  const absl::Duration chief_timeout_;  // a worker's wait for the chief
  const std::string me_;
  std::vector<Model*> pulled_parts_;  // read from the ps every step: the network, the trunk, the master (chief)
  // The parts whose buffers this task keeps and publishes: its network (and
  // on the chief the master); nobody else moves them.
  std::vector<const Model*> own_buffers_;
  std::vector<std::string> own_names_, trunk_names_, pulled_names_, own_buffer_names_;
};

// One task trains the whole ensemble, in one graph.
absl::StatusOr<WorkerResult> RunWholeEnsemble(WorkerContext& context, GatedEnsemble& ensemble) {
  Client& client = *context.client;
  BatchIterator batches = GatedBatchIndices(context.train_shard, *context.config);
  const std::vector<std::string>& names = ensemble.variable_names();
  WorkerResult result;
  int64_t t = 0;
  auto join = [&]() -> absl::Status {
    SHOAL_ASSIGN_OR_RETURN(t, client.AddToCounter(kGlobalStep, 0));
    return SeekToStep(client, t, batches);  // a batch a step: the step says where the data stands
  };
  SHOAL_RETURN_IF_ERROR(join());
  auto step_once = [&]() -> absl::StatusOr<bool> {
    if (t >= context.max_steps) return false;
    torch::Tensor index_rows, labels;
    batches.Next(&index_rows, &labels);
    const torch::Tensor images = context.train_shard.images.index_select(0, index_rows.squeeze(1).to(torch::kInt64));
    SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> values, client.Read(names));
    ensemble.Load(values);
    const GatedStepResult step = ensemble.OneGraphStep(images, labels);
    BatchResult batch;
    for (size_t k = 0; k < step.network_losses.size(); ++k) {
      batch.loss += step.network_losses[k] / step.network_losses.size();
      batch.accuracy += step.network_accuracies[k] / step.network_accuracies.size();
    }
    batch.examples = labels.size(0);
    StepInfo info = MakeStepInfo(result.local_steps + 1, t + 1, batch, ensemble.network(0));
    SHOAL_ASSIGN_OR_RETURN(bool send, CheckUpdate(context, names, step.gradients, info, &result));
    if (!send) return false;
    SHOAL_ASSIGN_OR_RETURN(std::vector<int64_t> counters,
                           client.ApplyGradients(names, step.gradients, {{kGlobalStep, 1}}));
    t = counters[0];
    SHOAL_RETURN_IF_ERROR(
        PublishBuffersIfDue(context, info, ensemble.buffer_names(), [&] { return ensemble.BufferValues(); }));
    return FinishStep(context, info, &result);
  };
  SHOAL_RETURN_IF_ERROR(
      StepUntilDone(context, names, ensemble.variables(), context.config->training.optimizer, step_once, join));
  return result;
}

absl::StatusOr<GatedModelConfig> Resolve(const StrategyConfig& config, int num_workers) {
  return ResolveGatedConfig(config.gated, config.model, num_workers);
}

}  // namespace

absl::StatusOr<std::vector<VariableSpec>> GatedVariableSpecs(const StrategyConfig& config, int num_workers) {
  SHOAL_ASSIGN_OR_RETURN(GatedModelConfig gated, Resolve(config, num_workers));
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<GatedEnsemble> ensemble, GatedEnsemble::Create(config.model, gated));
  std::vector<VariableSpec> specs = ensemble->VariableSpecs();
  if (num_workers > 1) {
    for (VariableSpec& spec : ExchangeSpecs(gated, config.training.batch_size, ensemble->classes())) {
      specs.push_back(std::move(spec));
    }
  }
  return specs;
}

ScopeRule GatedExchangeRule(const TaskId& chief) { return ScopeRule{"exchange/*", chief}; }

BatchIterator GatedBatchIndices(const Dataset& train, const StrategyConfig& config) {
  // BatchIterator shuffles by seed and size alone: iterating over the
  // indices gives the order it would give over the examples.
  const Dataset indices{torch::arange(train.size(), torch::kFloat32).unsqueeze(1), train.labels};
  return BatchIterator(indices, config.training.batch_size, config.training.seed * 1000003);
}

absl::StatusOr<WorkerResult> GatedStrategy::RunWorker(WorkerContext& context) {
  const StrategyConfig& config = *context.config;
  SHOAL_ASSIGN_OR_RETURN(GatedModelConfig gated, Resolve(config, context.num_workers));
  if (context.train_shard.size() >= kMaxExamples) {
    return absl::InvalidArgumentError(absl::StrCat("gated: the training set has ", context.train_shard.size(),
                                                   " examples; batches name at most 2^24"));
  }
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<GatedEnsemble> built, GatedEnsemble::Create(config.model, gated));
  GatedEnsemble& ensemble = *built;
  SHOAL_RETURN_IF_ERROR(ensemble.CheckShapes(context.train_shard));
  std::vector<std::string> names = ensemble.variable_names();
  std::vector<torch::Tensor> values = ensemble.variables();
  if (context.num_workers > 1) {
    for (const VariableSpec& spec : ExchangeSpecs(gated, config.training.batch_size, ensemble.classes())) {
      names.push_back(spec.name);
      values.push_back(torch::zeros(spec.shape));
    }
  }
  // A restore puts every counter of the lockstep, and the trunk's
  // accumulators, at the checkpoint's step.
  context.restore_accumulator_step = [&](int64_t global_step) -> absl::StatusOr<int64_t> {
    std::vector<std::string> counters = {kBatchCounter, kScalesCounter};
    for (int k = 1; k < context.num_workers; ++k) counters.push_back(LogitsCounter(k));
    for (const std::string& counter : counters) {
      SHOAL_RETURN_IF_ERROR(context.client->SetCounter(counter, global_step).status());
    }
    return global_step;
  };
  // The networks' buffers (BatchNorm statistics), created and restored with
  // the variables; a job that resumed from a checkpoint starts from its own.
  context.buffer_names = ensemble.buffer_names();
  context.buffer_values = ensemble.BufferValues();
  SHOAL_RETURN_IF_ERROR(InitializeOrWait(context, names, values, config.training.optimizer));
  if (!context.buffer_names.empty()) {
    SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> buffers, context.client->Read(context.buffer_names));
    ensemble.LoadBuffers(buffers);
  }
  if (context.num_workers == 1) return RunWholeEnsemble(context, ensemble);
  auto result = LockstepWorker(context, ensemble).Run(names, values);
  // The others would wait for this task until their deadline: release them.
  if (!result.ok()) context.client->AddToCounter(kJobAborted, 1).IgnoreError();
  return result;
}

absl::Status ReportGated(WorkerContext& context, const Dataset& test_set, TrainReport* report) {
  const StrategyConfig& config = *context.config;
  SHOAL_ASSIGN_OR_RETURN(GatedModelConfig gated, Resolve(config, context.num_workers));
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<GatedEnsemble> ensemble, GatedEnsemble::Create(config.model, gated));
  // The variables and the buffers, in one read.
  std::vector<std::string> names = ensemble->variable_names();
  names.insert(names.end(), ensemble->buffer_names().begin(), ensemble->buffer_names().end());
  SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> values, context.client->Read(names));
  const auto buffers = values.begin() + static_cast<std::ptrdiff_t>(ensemble->variable_names().size());
  ensemble->LoadBuffers({buffers, values.end()});
  values.erase(buffers, values.end());
  ensemble->Load(values);
  const GatedAccuracy accuracy = ensemble->Evaluate(test_set);
  report->test_accuracy = accuracy.gated_vote;
  report->test_loss = accuracy.mixture_loss;
  report->uniform_average_accuracy = accuracy.uniform_average;
  report->network_test_accuracies = accuracy.networks;
  report->any_network_right = accuracy.any_right;
  report->network_mean_weights = accuracy.mean_weights;
  return absl::OkStatus();
}

namespace {

// Every network and the master (TrainingMode::Final).
absl::StatusOr<FinalModel> FinalGatedEnsemble(const StrategyConfig& config, int workers, const ReadTensors& read,
                                               int member) {
  if (member >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a member (", member, ") picks one of a population's models; a gated ensemble is one model"));
  }
  SHOAL_ASSIGN_OR_RETURN(GatedModelConfig gated, Resolve(config, workers));
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<GatedEnsemble> ensemble, GatedEnsemble::Create(config.model, gated));
  FinalModel final_model;
  final_model.names = ensemble->variable_names();
  final_model.names.insert(final_model.names.end(), ensemble->buffer_names().begin(), ensemble->buffer_names().end());
  std::vector<torch::Tensor> like = ensemble->variables();
  for (torch::Tensor& buffer : ensemble->BufferValues()) like.push_back(std::move(buffer));
  SHOAL_ASSIGN_OR_RETURN(final_model.values, ReadChecked(read, final_model.names, like));
  const auto buffers = final_model.values.begin() + static_cast<std::ptrdiff_t>(ensemble->variables().size());
  ensemble->Load({final_model.values.begin(), buffers});
  ensemble->LoadBuffers({buffers, final_model.values.end()});
  ensemble->SetTraining(false);
  final_model.script = ensemble->Script();
  return final_model;
}

class Gated final : public TrainingMode {
 public:
  std::string name() const override { return "gated"; }
  bool CheckpointsHoldOneStep() const override { return true; }
  bool KeepsDataPosition() const override { return false; }  // a batch a lockstep step: the step says where it is
  std::unique_ptr<TrainingStrategy> MakeStrategy() const override { return std::make_unique<GatedStrategy>(); }
  bool ClassifiesOnly() const override { return true; }
  // A real cluster's size is known only when it starts: checked against one
  // worker per network then.
  absl::Status Validate(const StrategyConfig& config, int workers) const override {
    if (workers == 0) workers = config.gated.networks.empty() ? 2 : static_cast<int>(config.gated.networks.size());
    return Resolve(config, workers).status();
  }
  std::string Summary(const StrategyConfig& config, int workers) const override {
    auto gated = Resolve(config, workers);
    return gated.ok() ? GatedSummary(config.model, *gated) : TrainingMode::Summary(config, workers);
  }
  absl::StatusOr<std::vector<VariableSpec>> Variables(const StrategyConfig& config, int workers) const override {
    return GatedVariableSpecs(config, workers);
  }
  std::vector<ScopeRule> ScopeRules(const StrategyConfig& /*config*/, const std::vector<TaskId>& /*workers*/,
                                    const TaskId& chief) const override {
    return {GatedExchangeRule(chief)};
  }
  // Every network sees the chief's batches.
  void SplitData(const StrategyConfig& /*config*/, const Dataset& train, WorkerContext& context) const override {
    context.train_shard = train;
  }
  bool TrainsOneModel() const override { return false; }
  absl::Status Report(WorkerContext& context, const Dataset& test_set, TrainReport* report) const override {
    return ReportGated(context, test_set, report);
  }
  absl::StatusOr<FinalModel> Final(const StrategyConfig& config, int workers, const ReadTensors& read,
                                   int member) const override {
    return FinalGatedEnsemble(config, workers, read, member);
  }
};

}  // namespace

const TrainingMode& GatedMode() {
  static const Gated mode;
  return mode;
}

}  // namespace shoal
