#include "shoal/strategy/population_strategy.h"

#include "shoal/telemetry/phase.h"

#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/core/status.h"
#include "shoal/population/lineage.h"
#include "shoal/server/optimizer.h"

namespace shoal {
namespace {

constexpr char kPeerBytes[] = "population/peer_bytes";

std::string MemberStepCounter(int member) { return absl::StrCat("population/step/", member); }
// The member step of member `member`'s last decision, and while it waits
// to rank the others, the step their fitness must be measured at or after
// (0 otherwise). Not kept in checkpoints: a job started again decides afresh.
std::string DecidedCounter(int member) { return absl::StrCat("population/decided/", member); }
std::string NeedsCounter(int member) { return absl::StrCat("population/needs/", member); }

wire::OptimizerConfig Constant() {  // for variables that are only assigned
  wire::OptimizerConfig sgd;
  sgd.set_kind("sgd");
  return sgd;
}

torch::Tensor HyperparametersTensor(const Hyperparameters& h) {
  return torch::tensor({static_cast<float>(h.learning_rate), static_cast<float>(h.momentum),
                        static_cast<float>(h.weight_decay), static_cast<float>(h.batch_size)});
}

Hyperparameters FromTensor(const torch::Tensor& t) {
  Hyperparameters h;
  h.learning_rate = t[0].item<float>();
  h.momentum = t[1].item<float>();
  h.weight_decay = t[2].item<float>();
  h.batch_size = std::llround(t[3].item<float>());
  return h;
}

// Copies of tensors read from a ps: an in-process read aliases its memory.
std::vector<torch::Tensor> Clones(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> copies;
  for (const auto& t : tensors) copies.push_back(t.clone());
  return copies;
}

// Reads other members through its own client, with a short deadline,
// remembering values for peer_cache_steps member steps; that client's
// traffic is what reading peers costs.
class PeerReader {
 public:
  PeerReader(const Client& client, const PopulationConfig& config, std::string me)
      : client_(client.WithTimeout(absl::Seconds(config.peer_timeout_s))),
        cache_steps_(config.peer_cache_steps),
        me_(std::move(me)) {}

  Client& client() { return *client_; }

  absl::StatusOr<std::vector<torch::Tensor>> Read(const std::vector<std::string>& names, int64_t step) {
    auto it = cache_.find(names.front());
    if (cache_steps_ > 0 && it != cache_.end() && step - it->second.step <= cache_steps_) return it->second.values;
    auto values = client_->Read(names);
    if (!values.ok()) return values.status();
    std::vector<torch::Tensor> copies = Clones(*values);
    if (cache_steps_ > 0) cache_[names.front()] = {step, copies};
    return copies;
  }

  // A peer that does not answer is skipped; the warning is printed once.
  void Warn(int member, const absl::Status& status) {
    if (warned_.insert(member).second) {
      absl::FPrintF(stderr, "%s: member %d is unreachable, skipping it: %s\n", me_, member, status.ToString());
    }
  }
  void Reached(int member) { warned_.erase(member); }
  int64_t bytes_moved() const { return client_->bytes_sent() + client_->bytes_received(); }

 private:
  struct Cached {
    int64_t step;
    std::vector<torch::Tensor> values;
  };
  std::unique_ptr<Client> client_;
  int64_t cache_steps_;
  std::string me_;
  std::map<std::string, Cached> cache_;
  std::set<int> warned_;
};

// How often a member consults its policy, in member steps.
int64_t ReadySteps(const PopulationConfig& config) {
  if (config.ready_steps > 0) return config.ready_steps;
  return config.policy == "random" ? 1 : config.eval_steps;
}

struct Member {
  int index;
  std::vector<std::string> names;    // the model's variables
  std::vector<std::string> buffers;  // and its buffers (BatchNorm statistics)
  std::string hparams, fitness;
};

// Member m's names, from `model` built for member `own` (member models differ
// only in their scope): no model is built, no TorchScript file read again.
Member MemberOf(const Model& model, int own, int m) {
  const std::string from = MemberScope(own), to = MemberScope(m);
  auto rescope = [&](const std::vector<std::string>& names) {
    std::vector<std::string> out;
    for (const std::string& name : names) out.push_back(to + name.substr(from.size()));
    return out;
  };
  return Member{m, rescope(model.variable_names()), rescope(model.buffer_names()), HyperparametersVariable(m),
                FitnessVariable(m)};
}

// What a member keeps on the ps, in the order every list follows: its
// variables, its buffers, its hyper-parameters and its fitness.
std::vector<std::string> AllNames(const Member& member) {
  std::vector<std::string> names = member.names;
  names.insert(names.end(), member.buffers.begin(), member.buffers.end());
  names.push_back(member.hparams);
  names.push_back(member.fitness);
  return names;
}

// A member's lineage event, by field name: LineageEvent keeps growing
// fields, and a positional initializer would shift them silently.
LineageEvent MemberEvent(int member, int64_t step, const char* kind, double fitness, double loss,
                         const Hyperparameters& h) {
  LineageEvent event;
  event.member = member;
  event.step = step;
  event.event = kind;
  event.fitness = fitness;
  event.loss = loss;
  event.hyperparameters = h;
  return event;
}

// The job's counters as `index` saved them, where the counter task has
// fewer: in a population they only grow, and the global step is the sum of
// the member steps saved.
absl::Status RestorePopulationCounters(WorkerContext& context, const CheckpointIndex& index) {
  Client& client = *context.client;
  SHOAL_RETURN_IF_ERROR(RestoreSavedCounters(client, index));
  int64_t saved_steps = 0;
  for (const std::string& counter : PopulationCounters(*context.config, context.num_workers)) {
    auto saved = index.counters.find(counter);
    if (saved != index.counters.end()) saved_steps += saved->second;
  }
  SHOAL_ASSIGN_OR_RETURN(int64_t live, client.AddToCounter(kGlobalStep, 0));
  return saved_steps > live ? client.SetCounter(kGlobalStep, saved_steps).status() : absl::OkStatus();
}

// Puts `member`'s variables (shaped as `shapes_from`, then its
// hyper-parameters and fitness) back as `checkpoint` holds them, with their
// slots, the optimizer its hyper-parameters make and its member step; those
// it still has go back too. Mid-job the job's counters come back where a lost
// counter task has fewer; at start (a new session) only the member's steps
// count towards the global step. Returns the member step restored.
absl::StatusOr<int64_t> RestoreMember(WorkerContext& context, const Member& member, const Model& shapes_from,
                                      const wire::OptimizerConfig& base, const std::string& checkpoint,
                                      bool mid_job) {
  Client& client = *context.client;
  const std::vector<std::string> names = AllNames(member);
  std::vector<std::vector<int64_t>> shapes = shapes_from.StateShapes();
  shapes.push_back({4});
  shapes.push_back({3});
  CheckpointIndex index;
  SHOAL_ASSIGN_OR_RETURN(std::vector<CheckpointVariable> restored, LoadVariables(checkpoint, names, shapes, &index));
  const size_t trained = member.names.size(), kept = trained + member.buffers.size();
  const Hyperparameters h = FromTensor(restored[kept].value);
  const wire::OptimizerConfig optimizer = WithHyperparameters(base, h);
  if (!mid_job) {
    // The member's workers' places in the data, before its variables exist,
    // which is when those workers read them.
    const int per_member = context.config->population.workers_per_member;
    for (int w = member.index * per_member; w < (member.index + 1) * per_member; ++w) {
      SHOAL_RETURN_IF_ERROR(
          client.SetCounter(DataPositionCounter(w, context.num_workers), KeptDataPosition(context, index, w))
              .status());
    }
  }
  std::vector<VariableInit> inits;
  for (size_t i = 0; i < names.size(); ++i) {
    inits.push_back({names[i], restored[i].value, i < trained ? optimizer : Constant(),
                     context.config->training.use_locking, /*buffer=*/i >= trained && i < kept});
  }
  SHOAL_RETURN_IF_ERROR(client.CreateVariables(inits));
  SHOAL_RETURN_IF_ERROR(client.SetOptimizer(member.names, optimizer));
  SHOAL_RETURN_IF_ERROR(RestoreVariables(client, restored, names));
  const std::string step_counter = MemberStepCounter(member.index);
  auto saved = index.counters.find(step_counter);
  const int64_t step = saved != index.counters.end() ? saved->second : 0;
  if (mid_job) {
    SHOAL_RETURN_IF_ERROR(RestorePopulationCounters(context, index));
  } else {
    SHOAL_RETURN_IF_ERROR(client.AddToCounter(kGlobalStep, step).status());
  }
  SHOAL_RETURN_IF_ERROR(client.SetCounter(step_counter, step).status());
  SHOAL_RETURN_IF_ERROR(client.AddToCounter(kRestores, 1).status());
  return step;
}

// A member's lead after a task holding its variables was lost (and is
// perhaps back, empty): once every task answers, a member that lacks some
// of its variables gets all of them back from the newest checkpoint
// (RestoreMember); one whose variables all survived keeps them, and only the
// job's counters come back where a lost counter task has fewer. Its other
// workers wait for the variables. Each member recovers by itself: the
// others train on.
absl::Status RecoverMember(WorkerContext& context, const Member& member, const Model& shapes_from,
                           const wire::OptimizerConfig& base, bool lead, const absl::Status& error) {
  Client& client = *context.client;
  const std::vector<std::string> names = AllNames(member);
  absl::FPrintF(stderr, "%s: %s; waiting for member %d to recover\n", context.task.ToString(), error.message(),
                member.index);
  if (!lead) {
    absl::Status back =
        client.WaitForVariables(names, absl::Seconds(context.config->transport.startup_timeout_s));
    return back.ok() ? back : Annotate(error, absl::StrCat("the variables did not come back: ", back.message()));
  }
  SHOAL_ASSIGN_OR_RETURN(std::vector<bool> exist, VariablesOnceAnswered(context, names, error));
  SHOAL_ASSIGN_OR_RETURN(const std::unique_ptr<CheckpointInUse> held, CheckpointToRecoverFrom(context, error));
  const std::string& latest = held->path();
  if (AllExist(exist)) {
    SHOAL_ASSIGN_OR_RETURN(CheckpointIndex index, ReadCheckpointIndex(latest));
    return RestorePopulationCounters(context, index);
  }
  SHOAL_ASSIGN_OR_RETURN(int64_t step, RestoreMember(context, member, shapes_from, base, latest, /*mid_job=*/true));
  context.recoveries.push_back(
      absl::StrCat("member ", member.index, ": restored ", latest, " (member step ", step, ") after: ",
                   error.message()));
  absl::FPrintF(stderr, "%s: %s\n", context.task.ToString(), context.recoveries.back());
  return absl::OkStatus();
}

}  // namespace

int NumMembers(const StrategyConfig& config, int num_workers) {
  return std::max(1, num_workers / config.population.workers_per_member);
}

std::string MemberScope(int member) { return absl::StrCat("worker_", member, "/"); }

ModelConfig MemberModel(const StrategyConfig& config, int member) {
  ModelConfig model = config.model;
  model.scope = MemberScope(member);
  model.seed = config.model.seed + member;
  return model;
}

std::vector<std::string> PopulationCounters(const StrategyConfig& config, int num_workers) {
  std::vector<std::string> counters;
  for (int m = 0; m < NumMembers(config, num_workers); ++m) counters.push_back(MemberStepCounter(m));
  return counters;
}

std::string HyperparametersVariable(int member) { return MemberScope(member) + "hparams"; }
std::string FitnessVariable(int member) { return MemberScope(member) + "fitness"; }

absl::StatusOr<std::vector<VariableSpec>> PopulationVariableSpecs(const StrategyConfig& config, int num_workers) {
  std::vector<VariableSpec> specs;
  for (int m = 0; m < NumMembers(config, num_workers); ++m) {
    SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, MakeModel(MemberModel(config, m)));
    for (const auto& spec : model->VariableSpecs()) specs.push_back(spec);
    for (const auto& spec : model->BufferSpecs()) specs.push_back(spec);
    specs.push_back({HyperparametersVariable(m), {4}});
    specs.push_back({FitnessVariable(m), {3}});
  }
  return specs;
}

std::vector<ScopeRule> PopulationScopeRules(const StrategyConfig& config, const std::vector<TaskId>& workers) {
  std::vector<ScopeRule> rules;
  if (config.population.variables_on != "member") return rules;
  const int members = NumMembers(config, static_cast<int>(workers.size()));
  for (int m = 0; m < members; ++m) {
    rules.push_back({MemberScope(m) + "*", workers[m * config.population.workers_per_member]});
  }
  return rules;
}

absl::StatusOr<MemberState> ReadMemberState(Client& reader, const std::vector<std::string>& names, bool with_slots,
                                            const std::vector<std::string>& buffers) {
  MemberState state;
  if (!names.empty()) {
    SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> values, reader.Read(names));
    state.values = Clones(values);
  }
  if (!buffers.empty()) {
    SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> read, reader.Read(buffers));
    state.buffers = Clones(read);
  }
  if (with_slots && !names.empty()) {
    SHOAL_ASSIGN_OR_RETURN(state.slots, reader.ReadSlots(names));
  }
  return state;
}

absl::Status WriteMemberState(Client& writer, const MemberState& state, const std::vector<std::string>& names,
                              const std::vector<std::string>& buffers) {
  if (!buffers.empty()) SHOAL_RETURN_IF_ERROR(writer.Assign(buffers, state.buffers));
  if (!names.empty()) SHOAL_RETURN_IF_ERROR(writer.Assign(names, state.values));
  if (!state.slots.empty()) SHOAL_RETURN_IF_ERROR(writer.AssignSlots(names, state.slots));
  return absl::OkStatus();
}

absl::Status InheritMember(Client& reader, Client& writer, const std::vector<std::string>& from,
                           const std::vector<std::string>& to, bool with_slots,
                           const std::vector<std::string>& buffers_from, const std::vector<std::string>& buffers_to) {
  SHOAL_ASSIGN_OR_RETURN(MemberState state, ReadMemberState(reader, from, with_slots, buffers_from));
  return WriteMemberState(writer, state, to, buffers_to);
}

absl::StatusOr<WorkerResult> PopulationStrategy::RunWorker(WorkerContext& context) {
  const StrategyConfig& config = *context.config;
  const PopulationConfig& pc = config.population;
  Client& client = *context.client;
  const int members = NumMembers(config, context.num_workers);
  const int me = context.worker_index / pc.workers_per_member;
  const bool lead = context.worker_index % pc.workers_per_member == 0;  // evaluates and decides
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> built, MakeModel(MemberModel(config, me)));
  Model& model = *built;
  const Member own = MemberOf(model, me, me);
  SHOAL_ASSIGN_OR_RETURN(auto base, Optimizer::Create(config.training.optimizer));
  std::mt19937_64 rng(config.training.seed * 7919 + me);

  // Start-up: the lead creates the member's variables (a restarted lead finds
  // them and keeps their values and hyper-parameters); its workers wait.
  const std::vector<std::string> all_names = AllNames(own);
  if (lead) {
    const Hyperparameters start =
        DrawInitial(pc, HyperparametersOf(base->config(), config.training.batch_size), rng);
    std::vector<VariableInit> inits;
    for (size_t i = 0; i < own.names.size(); ++i) {
      inits.push_back({own.names[i], model.variables()[i].detach(), WithHyperparameters(base->config(), start),
                       config.training.use_locking});
    }
    for (size_t i = 0; i < own.buffers.size(); ++i) {
      inits.push_back({own.buffers[i], model.buffers()[i].detach(), Constant(), false, /*buffer=*/true});
    }
    inits.push_back({own.hparams, HyperparametersTensor(start), Constant()});
    inits.push_back({own.fitness, torch::tensor({-1.0f, 0.0f, 0.0f}), Constant()});
    SHOAL_RETURN_IF_ERROR(client.WaitForTasksHolding(all_names, absl::Seconds(config.transport.startup_timeout_s)));
    // What the places in the data are for, kept with them in checkpoints
    // (every lead sets the same value).
    SHOAL_RETURN_IF_ERROR(client.SetCounter(kDataFingerprint, context.data_fingerprint).status());
    SHOAL_ASSIGN_OR_RETURN(std::string checkpoint, CheckpointToRestore(context, all_names));
    if (checkpoint.empty()) {
      SHOAL_RETURN_IF_ERROR(client.CreateVariables(inits));
    } else {
      SHOAL_ASSIGN_OR_RETURN(int64_t restored_step,
                             RestoreMember(context, own, model, base->config(), checkpoint, /*mid_job=*/false));
      if (context.is_chief) {
        context.restored_from = checkpoint;
        context.restored_step = restored_step;
      }
      absl::FPrintF(stderr, "%s: member %d restored from %s (member step %d)\n", context.task.ToString(), me,
                    checkpoint, restored_step);
    }
  } else {
    SHOAL_RETURN_IF_ERROR(
        client.WaitForVariables(all_names, absl::Seconds(config.transport.startup_timeout_s)));
  }
  context.startup_bytes_sent = client.bytes_sent();
  context.startup_bytes_received = client.bytes_received();
  context.startup_tensor_bytes_sent = client.tensor_bytes_sent();
  SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> stored, client.Read({own.hparams}));
  Hyperparameters h = FromTensor(stored[0]);

  std::unique_ptr<LineageLog> lineage;
  PeerReader peers(client, pc, context.task.ToString());
  const int64_t ready = ReadySteps(pc);
  const int64_t member_steps = std::max<int64_t>(1, context.max_steps / members);
  SHOAL_ASSIGN_OR_RETURN(int64_t step, client.AddToCounter(MemberStepCounter(me), 0));
  if (lead) {
    SHOAL_ASSIGN_OR_RETURN(lineage, LineageLog::Open(pc.lineage_dir, me, /*append=*/step > 0));
    SHOAL_RETURN_IF_ERROR(lineage->Write(MemberEvent(me, step, "start", -1, 0, h)));
  }
  // Each worker reads its shard in one order of its own, whatever the batch
  // size, exploits and restarts: one pass over the data stays one pass.
  const uint64_t data_seed = config.training.seed * 1000003 + context.worker_index;
  std::unique_ptr<BatchIterator> batches;
  auto draw_from = [&](int64_t examples, int64_t batch_size) {
    batches = std::make_unique<BatchIterator>(context.train_shard, batch_size, data_seed);
    batches->SeekTo(examples);
  };
  SHOAL_ASSIGN_OR_RETURN(const int64_t position, ReadDataPosition(context));
  draw_from(position, h.batch_size);
  if (position > 0) {
    absl::FPrintF(stderr, "%s: reads its data on from where member %d left it, %d examples in (its shard holds %d)\n",
                  context.task.ToString(), me, position, context.train_shard.size());
  }
  int64_t evaluated_at = step, decided_at = step;
  bool decided_since_evaluated = false;
  int64_t published_at = 0;  // the member step its published fitness was measured at
  double fitness = -1, loss = 0;
  WorkerResult result;

  // `values` in the model, over the validation set in one batch: one
  // forward pass.
  auto validate = [&](const std::vector<torch::Tensor>& values) -> absl::StatusOr<Evaluation> {
    model.Load(values);
    model.SetTraining(false);
    absl::StatusOr<Evaluation> measured =
        Evaluate(model, context.validation, std::max<int64_t>(1, context.validation.size()));
    model.SetTraining(true);
    return measured;
  };
  // The evaluation round a decision at `at` ranks the members by: every
  // member's fitness measured at or after it.
  auto round_of = [&](int64_t at) { return at / pc.eval_steps * pc.eval_steps; };
  // Before it publishes a fitness measured after its last decision, a
  // member waits (up to training.sync_timeout_s, or a stop) until every
  // other reachable member has made its decision of that round too: so the
  // decisions of a ready interval rank the members by the same fitness, the
  // one each measured for it, and a copy made in it moves no one else into
  // the bottom set. It does not wait for a member that is itself waiting
  // for a fitness newer than this one's (their steps are not aligned, as
  // after a member's restore): that member needs this publication to go on;
  // nor for one that has trained all its steps.
  auto wait_for_decisions = [&]() -> absl::Status {
    if (!decided_since_evaluated) return absl::OkStatus();
    const absl::Time give_up = absl::Now() + absl::Seconds(config.training.sync_timeout_s);
    std::vector<int> waiting;
    for (int m = 0; m < members; ++m) {
      if (m != me) waiting.push_back(m);
    }
    for (absl::Duration backoff = absl::Milliseconds(2); !waiting.empty();
         backoff = std::min(2 * backoff, absl::Milliseconds(50))) {
      std::vector<int> still;
      for (int m : waiting) {
        SHOAL_ASSIGN_OR_RETURN(
            const std::vector<int64_t> theirs,
            client.AddToCounters({{DecidedCounter(m), 0}, {NeedsCounter(m), 0}, {MemberStepCounter(m), 0}}));
        const bool decided = theirs[0] > 0 && round_of(theirs[0]) >= round_of(decided_at);
        const bool needs_newer = theirs[1] > published_at;
        const bool finished = theirs[2] >= member_steps;  // decides no more
        if (decided || needs_newer || finished) continue;
        if (!peers.client().Read({FitnessVariable(m)}).ok()) continue;  // gone: nothing to wait for
        still.push_back(m);
      }
      waiting = std::move(still);
      if (waiting.empty()) break;
      SHOAL_ASSIGN_OR_RETURN(bool stopped, JobStopRequested(client));
      if (stopped) break;
      if (absl::Now() > give_up) {
        absl::FPrintF(stderr, "%s: member %d had not decided at step %d within %ss; publishing the next fitness\n",
                      context.task.ToString(), waiting.front(), decided_at,
                      absl::StrCat(config.training.sync_timeout_s));
        break;
      }
      absl::SleepFor(backoff);
    }
    return absl::OkStatus();
  };
  // The lead's buffers are the member's: published before each
  // evaluation, so that a member that copies this one copies them too.
  auto evaluate = [&]() -> absl::Status {
    SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> values, client.Read(own.names));
    if (!own.buffers.empty()) SHOAL_RETURN_IF_ERROR(client.Assign(own.buffers, model.BufferValues()));
    SHOAL_ASSIGN_OR_RETURN(const Evaluation validation, validate(values));
    SHOAL_RETURN_IF_ERROR(wait_for_decisions());
    decided_since_evaluated = false;
    fitness = validation.accuracy;
    loss = validation.loss;
    SHOAL_RETURN_IF_ERROR(client.Assign({own.fitness}, {torch::tensor({static_cast<float>(fitness),
                                                                       static_cast<float>(loss),
                                                                       static_cast<float>(step)})}));
    published_at = step;
    return lineage->Write(MemberEvent(me, step, "eval", fitness, loss, h));
  };

  // Every member's latest fitness. Policies that rank by fitness first wait
  // (up to training.sync_timeout_s, or a stop) until every reachable member
  // has published one from this evaluation round (at or past the last
  // multiple of eval_steps), so that no decision ranks the others by their
  // fitness of a round ago, or not at all in the first round. Before the
  // first round there is nothing to wait for; random ranks nobody.
  auto read_statuses = [&](std::vector<int64_t>* measured_at) -> absl::StatusOr<std::vector<MemberStatus>> {
    const int64_t fresh_from = pc.policy == "random" ? 0 : round_of(step);
    const absl::Time give_up = absl::Now() + absl::Seconds(config.training.sync_timeout_s);
    std::vector<MemberStatus> statuses(members);
    measured_at->assign(members, -1);
    std::vector<bool> settled(members, false);
    for (absl::Duration backoff = absl::Milliseconds(5);; backoff = std::min(2 * backoff, absl::Milliseconds(100))) {
      bool all_settled = true;
      for (int m = 0; m < members; ++m) {
        if (settled[m]) continue;
        MemberStatus& status = statuses[m];
        status.member = m;
        if (m == me) {
          status.evaluated = fitness >= 0;
          // As the others read it (float32 on the ps), so that every member
          // ranks a tie alike.
          status.fitness = static_cast<float>(fitness);
          status.loss = loss;
          (*measured_at)[m] = step;
          settled[m] = true;
          continue;
        }
        auto read = peers.client().Read({FitnessVariable(m)});
        status.reachable = read.ok();
        if (absl::IsNotFound(read.status()) && absl::Now() <= give_up) {
          all_settled = false;  // its lead has not created its variables yet: waited for as the others
          continue;
        }
        if (!read.ok()) {
          peers.Warn(m, read.status());
          settled[m] = true;  // skipped by the policy
          continue;
        }
        peers.Reached(m);
        const float* f = (*read)[0].data_ptr<float>();
        status.evaluated = f[0] >= 0;
        status.fitness = f[0];
        status.loss = f[1];
        (*measured_at)[m] = static_cast<int64_t>(f[2]);
        settled[m] = fresh_from == 0 || (status.evaluated && (*measured_at)[m] >= fresh_from);
        all_settled = all_settled && settled[m];
      }
      if (all_settled) break;
      SHOAL_ASSIGN_OR_RETURN(bool stopped, JobStopRequested(client));
      if (stopped) break;
      if (absl::Now() > give_up) {
        absl::FPrintF(stderr, "%s: not every member measured its fitness for step %d within %ss; ranking them by "
                      "their last one\n", context.task.ToString(), fresh_from,
                      absl::StrCat(config.training.sync_timeout_s));
        break;
      }
      absl::SleepFor(backoff);
    }
    return statuses;
  };

  // A donor's state, as read, on this member's validation split. The model's
  // own buffers are put back; its weights are loaded afresh before every step.
  auto measure = [&](int donor, const MemberState& state) -> absl::StatusOr<MemberStatus> {
    std::vector<torch::Tensor> own_buffers;
    if (!state.buffers.empty()) {
      own_buffers = Clones(model.BufferValues());
      model.LoadBuffers(state.buffers);
    }
    absl::StatusOr<Evaluation> measured = validate(state.values);
    if (!own_buffers.empty()) model.LoadBuffers(own_buffers);
    if (!measured.ok()) return measured.status();
    MemberStatus now;
    now.member = donor;
    now.evaluated = true;
    now.fitness = measured->accuracy;
    now.loss = measured->loss;
    return now;
  };

  // The donor's weights, buffers and, to inherit them, slots: read once,
  // measured, then copied as measured. Weights with slots are read together,
  // fresh; weights alone may come from the peer cache.
  auto read_donor = [&](const Member& source) -> absl::StatusOr<MemberState> {
    if (pc.inherit_slots) return ReadMemberState(peers.client(), source.names, /*with_slots=*/true, source.buffers);
    SHOAL_ASSIGN_OR_RETURN(MemberState state,
                           ReadMemberState(peers.client(), {}, /*with_slots=*/false, source.buffers));
    SHOAL_ASSIGN_OR_RETURN(state.values, peers.Read(source.names, step));
    return state;
  };

  // Exploit and explore, as the policy decides; every decision goes to the
  // lineage with the fitness it saw.
  int64_t exploits = 0;  // this member's copies of another, for TensorBoard
  auto decide = [&]() -> absl::Status {
    std::vector<int64_t> seen_steps;
    const bool ranks = pc.policy != "random";
    if (ranks) SHOAL_RETURN_IF_ERROR(client.SetCounter(NeedsCounter(me), round_of(step)).status());
    auto statuses = read_statuses(&seen_steps);
    if (ranks) SHOAL_RETURN_IF_ERROR(client.SetCounter(NeedsCounter(me), 0).status());
    if (!statuses.ok()) return statuses.status();
    LineageEvent decided = MemberEvent(me, step, "keep", fitness, loss, h);
    for (const MemberStatus& s : *statuses) decided.seen.push_back(s.reachable && s.evaluated ? s.fitness : -1);
    decided.seen_steps = seen_steps;
    const ExploitDecision decision = DecideExploit(pc, me, *statuses, rng);
    if (!decision.exploit) {
      decided.reason = decision.reason;
      // random decides every step without ranking anyone: only its copies are logged.
      return pc.policy == "random" ? absl::OkStatus() : lineage->Write(decided);
    }
    const Member source = MemberOf(model, me, decision.source);
    const MemberStatus& theirs = (*statuses)[decision.source];
    absl::StatusOr<MemberState> donor = read_donor(source);
    absl::StatusOr<MemberStatus> donor_now =
        donor.ok() ? measure(source.index, *donor) : absl::StatusOr<MemberStatus>(donor.status());
    if (!donor_now.ok()) {  // the source went away meanwhile: keep training our own
      peers.Warn(decision.source, donor_now.status());
      decided.reason = absl::StrCat(decision.reason, "; not copied: member ", decision.source, " went away");
      return lineage->Write(decided);
    }
    if (std::string refused = RefuseStaleDonor(pc, (*statuses)[me], theirs, *donor_now); !refused.empty()) {
      decided.reason = absl::StrCat(decision.reason, "; not copied: ", refused);
      return lineage->Write(decided);
    }
    if (absl::Status copied = WriteMemberState(client, *donor, own.names, own.buffers); !copied.ok()) {
      peers.Warn(decision.source, copied);
      decided.reason = absl::StrCat(decision.reason, "; not copied: ", copied.message());
      return lineage->Write(decided);
    }
    if (!donor->buffers.empty()) model.LoadBuffers(donor->buffers);  // the donor's statistics, now the member's
    if (decision.copy_hyperparameters) {
      auto theirs = peers.client().Read({source.hparams});
      if (theirs.ok()) h = FromTensor((*theirs)[0]);
    }
    h = Explore(pc, h, rng);
    SHOAL_RETURN_IF_ERROR(client.SetOptimizer(own.names, WithHyperparameters(base->config(), h)));
    SHOAL_RETURN_IF_ERROR(client.Assign({own.hparams}, {HyperparametersTensor(h)}));
    // It keeps its own measured fitness until it measures again, as Ray
    // Tune's PBT keeps a copier's last result: carrying its donor's would
    // push another member into the bottom set in the same interval (a
    // cascade of copies). The donor's, measured now, is in the reason.
    if (h.batch_size != batches->batch_size()) draw_from(batches->examples_drawn(), h.batch_size);
    decided.event = "exploit";
    ++exploits;
    decided.source = decision.source;
    decided.reason = absl::StrFormat("%s; member %d measured %.4f on this member's validation split",
                                     decision.reason, decision.source, donor_now->fitness);
    decided.hyperparameters = h;
    return lineage->Write(decided);
  };

  auto step_once = [&]() -> absl::StatusOr<bool> {
    if (step >= member_steps) return false;
    if (context.before_step) context.before_step(result.local_steps);
    std::vector<std::string> pull = own.names;
    if (!lead) pull.push_back(own.hparams);  // the lead may have changed the batch size
    std::vector<torch::Tensor> values;
    {
      PhaseScope timed(Phase::kPull);
      SHOAL_ASSIGN_OR_RETURN(values, client.Read(pull));
    }
    if (!lead) {
      const Hyperparameters now = FromTensor(values.back());
      values.pop_back();
      if (now.batch_size != h.batch_size) draw_from(batches->examples_drawn(), now.batch_size);
      h = now;
    }
    model.Load(values);
    BatchResult batch = ComputeGradients(model, *batches);
    context.unpublished_examples += batch.examples;
    StepInfo info = MakeStepInfo(result.local_steps + 1, step, batch, model);
    const std::vector<torch::Tensor> gradients = model.Gradients();
    SHOAL_ASSIGN_OR_RETURN(bool send, CheckUpdate(context, own.names, gradients, info, &result));
    if (!send) return false;
    std::vector<int64_t> counters;
    {
      PhaseScope timed(Phase::kPush);
      SHOAL_ASSIGN_OR_RETURN(counters, client.ApplyGradients(own.names, gradients,
                                                             {{MemberStepCounter(me), 1},
                                                              {kGlobalStep, 1},
                                                              {kStopRequested, 0},
                                                              TakeDataPosition(context)}));
    }
    step = counters[0];
    info.global_step = counters[1];
    if (lead && step - evaluated_at >= pc.eval_steps) {
      evaluated_at = step;
      SHOAL_RETURN_IF_ERROR(evaluate());
    }
    if (lead && pc.policy != "none" && step - decided_at >= ready && step < member_steps) {
      decided_at = step;
      info.exchanged = true;
      SHOAL_RETURN_IF_ERROR(decide());
      decided_since_evaluated = true;
      SHOAL_RETURN_IF_ERROR(client.SetCounter(DecidedCounter(me), step).status());
    }
    info.learning_rate = h.learning_rate;
    info.scalars = {{"population/fitness", fitness}, {"population/exploits", static_cast<double>(exploits)}};
    SHOAL_ASSIGN_OR_RETURN(bool go_on, FinishStep(context, info, &result));
    return go_on && counters[2] == 0;
  };
  // After a recovery: the member's step, hyper-parameters and fitness as
  // they now are (a restored member's are the checkpoint's: the fitness
  // measured on the values it now trains from, which the others see too;
  // the one it measured before the loss belongs to values that are gone).
  auto rejoin = [&]() -> absl::Status {
    SHOAL_ASSIGN_OR_RETURN(step, client.AddToCounter(MemberStepCounter(me), 0));
    SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> now, client.Read({own.hparams, own.fitness}));
    const Hyperparameters restored = FromTensor(now[0]);
    const float* published = now[1].data_ptr<float>();
    fitness = published[0];
    loss = published[1];
    published_at = static_cast<int64_t>(published[2]);
    if (lead) SHOAL_RETURN_IF_ERROR(lineage->Write(MemberEvent(me, step, "rejoin", fitness, loss, restored)));
    // The examples of its steps the ps took in: those drawn since, undone or
    // never sent, are drawn again.
    SHOAL_ASSIGN_OR_RETURN(const int64_t position, ReadDataPosition(context));
    draw_from(position, restored.batch_size);
    context.unpublished_examples = 0;
    h = restored;
    evaluated_at = decided_at = step;
    decided_since_evaluated = false;  // its steps went back: nothing decided since is to wait for
    return absl::OkStatus();
  };
  SHOAL_RETURN_IF_ERROR(StepUntilDone(context, step_once, [&](const absl::Status& error) -> absl::Status {
    SHOAL_RETURN_IF_ERROR(RecoverMember(context, own, model, base->config(), lead, error));
    return rejoin();
  }));
  if (lead) {
    SHOAL_RETURN_IF_ERROR(evaluate());
    SHOAL_RETURN_IF_ERROR(lineage->Write(MemberEvent(me, step, "end", fitness, loss, h)));
  }
  SHOAL_RETURN_IF_ERROR(client.AddToCounter(kPeerBytes, peers.bytes_moved()).status());
  return result;
}

absl::Status ReportPopulation(WorkerContext& context, const Dataset& test_set, TrainReport* report) {
  const StrategyConfig& config = *context.config;
  Client& client = *context.client;
  double best_fitness = -2;
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> first, MakeModel(MemberModel(config, 0)));
  for (int m = 0; m < NumMembers(config, context.num_workers); ++m) {
    const Member member = MemberOf(*first, 0, m);
    MemberReport row;
    row.member = m;
    SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> small, client.Read({member.hparams, member.fitness}));
    row.hyperparameters = FromTensor(small[0]).ToString();
    row.fitness = small[1][0].item<float>();
    SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, MakeModel(MemberModel(config, m)));
    SHOAL_RETURN_IF_ERROR(PullVariablesAndBuffers(client, *model));
    model->SetTraining(false);
    SHOAL_ASSIGN_OR_RETURN(const Evaluation figures, Evaluate(*model, test_set));
    row.test_accuracy = figures.accuracy;
    if (row.fitness > best_fitness) {
      best_fitness = row.fitness;
      report->best_member = m;
      report->test_accuracy = row.test_accuracy;
    }
    report->members.push_back(row);
  }
  SHOAL_ASSIGN_OR_RETURN(report->peer_bytes_read, client.AddToCounter(kPeerBytes, 0));
  // The lineage files are on this machine when the members are (one process,
  // or local processes); on a real cluster each member's lead has its own.
  auto events = ReadLineage(config.population.lineage_dir);
  if (events.ok()) {
    const int64_t ready = ReadySteps(config.population);
    report->population_summary = PopulationSummary(*events, ready);
    const CopyStatistics copies = CountCopies(*events, ready);
    report->copies_per_interval = copies.copies_per_interval;
    report->copies = copies.copies;
    report->copies_by_the_worst = copies.copies_by_the_worst;
    SHOAL_RETURN_IF_ERROR(DrawLineage(*events, config.population.lineage_dir + "/lineage.svg"));
  } else {
    report->population_summary = absl::StrCat("(no lineage: ", events.status().message(), ")\n");
  }
  return absl::OkStatus();
}

namespace {

// The fittest member, or the one asked for (TrainingMode::Final).
absl::StatusOr<FinalModel> FinalPopulationMember(const StrategyConfig& config, int workers, const ReadTensors& read,
                                                  int member) {
  const int members = NumMembers(config, workers);
  if (member >= members) {
    return absl::InvalidArgumentError(absl::StrCat("member ", member, " is out of range: the population has ", members,
                                                   " members (0 to ", members - 1, ")"));
  }
  if (member < 0) {  // the fittest, by the fitness each member last measured
    std::vector<std::string> fitness_names;
    for (int m = 0; m < members; ++m) fitness_names.push_back(FitnessVariable(m));
    SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> fitness, read(fitness_names));
    float best = -2;
    for (int m = 0; m < members; ++m) {
      if (fitness[m].numel() == 0 || fitness[m].scalar_type() != torch::kFloat32) {
        return absl::InvalidArgumentError(absl::StrCat("variable '", fitness_names[m], "' is not a fitness"));
      }
      if (fitness[m].reshape(-1)[0].item<float>() > best) {
        best = fitness[m].reshape(-1)[0].item<float>();
        member = m;
      }
    }
  }
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, MakeModel(MemberModel(config, member)));
  SHOAL_ASSIGN_OR_RETURN(FinalModel final_model, FinalOf(*model, read, MemberScope(member)));
  final_model.member = member;
  return final_model;
}

class Population final : public TrainingMode {
 public:
  std::string name() const override { return "population"; }
  std::unique_ptr<TrainingStrategy> MakeStrategy() const override { return std::make_unique<PopulationStrategy>(); }
  bool ClassifiesOnly() const override { return true; }
  // The learning-rate prior (population.learning_rate_range, 1e-4 to 0.1) is
  // an SGD-scale one: Adam, the async default, diverges at its top end.
  wire::OptimizerConfig DefaultOptimizer() const override {
    wire::OptimizerConfig o;
    o.set_kind("momentum");
    o.set_learning_rate(0.01);
    o.set_momentum(0.9);
    return o;
  }
  absl::Status Validate(const StrategyConfig& config, int workers) const override {
    const int per_member = config.population.workers_per_member;
    if (workers > 0 && per_member > 0 && workers % per_member != 0) {
      return absl::InvalidArgumentError(absl::StrCat("config: 'cluster.workers' (", workers,
                                                     ") is not a multiple of 'population.workers_per_member' (",
                                                     per_member, ")"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<VariableSpec>> Variables(const StrategyConfig& config, int workers) const override {
    return PopulationVariableSpecs(config, workers);
  }
  std::vector<ScopeRule> ScopeRules(const StrategyConfig& config, const std::vector<TaskId>& workers,
                                    const TaskId& /*chief*/) const override {
    return PopulationScopeRules(config, workers);
  }
  bool WorkersHostVariables() const override { return true; }
  // Every member trains on the whole training set but its end, the
  // validation split that measures fitness; a member's workers share it.
  void SplitData(const StrategyConfig& config, const Dataset& train, WorkerContext& context) const override {
    const int64_t validation = std::min(config.population.validation_examples, train.size() - 1);
    const int64_t trained = train.size() - validation;
    context.validation = Dataset{train.images.narrow(0, trained, validation), train.labels.narrow(0, trained, validation)};
    const Dataset rest{train.images.narrow(0, 0, trained), train.labels.narrow(0, 0, trained)};
    const int per_member = config.population.workers_per_member;
    context.train_shard = rest.Shard(context.worker_index % per_member, per_member);
  }
  // Every member trains on all of it but the validation split.
  int64_t ExamplesPerEpoch(const StrategyConfig& config, int64_t train_examples, int workers) const override {
    const int64_t trained = std::max<int64_t>(1, train_examples - config.population.validation_examples);
    return trained * (workers / config.population.workers_per_member);
  }
  std::vector<std::string> SavedCounters(const StrategyConfig& config, int workers) const override {
    return PopulationCounters(config, workers);
  }
  bool TrainsOneModel() const override { return false; }
  absl::Status Report(WorkerContext& context, const Dataset& test_set, TrainReport* report) const override {
    return ReportPopulation(context, test_set, report);
  }
  absl::StatusOr<FinalModel> Final(const StrategyConfig& config, int workers, const ReadTensors& read,
                                   int member) const override {
    return FinalPopulationMember(config, workers, read, member);
  }
};

}  // namespace

const TrainingMode& PopulationMode() {
  static const Population mode;
  return mode;
}

}  // namespace shoal
