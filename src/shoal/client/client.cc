#include "shoal/client/client.h"

#include <algorithm>
#include <functional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "shoal/core/distinct_ids.h"
#include "shoal/core/dtype.h"
#include "shoal/core/status.h"

namespace shoal {

// The part of one client operation addressed to one task. `pieces` records,
// for each tensor in the request (or response), which variable and which
// shard of it the tensor is.
struct Client::TaskCall {
  Request request;
  Response response;
  std::vector<std::pair<size_t, size_t>> pieces;  // (variable index, shard index)
};

namespace {

// Splits `value` into the rows of `shard`, without copying.
torch::Tensor Slice(const torch::Tensor& value, const VariablePlacement& vp, const Shard& shard) {
  if (!vp.partitioned()) return value;
  return value.narrow(0, shard.row_begin, shard.row_end - shard.row_begin);
}

// Checks that a tensor meant for a partitioned variable has its full shape, so
// slicing cannot throw; the server checks the slices against the parts.
absl::Status CheckPartitionedShape(const std::string& name, const VariablePlacement& vp, const torch::Tensor& t) {
  if (!vp.partitioned()) return absl::OkStatus();
  if (!t.defined() || t.sizes() != c10::IntArrayRef(vp.shape)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor for partitioned variable '", name, "' has shape [",
                                                   t.defined() ? absl::StrJoin(t.sizes(), ",") : "undefined",
                                                   "], expected [", absl::StrJoin(vp.shape, ","), "]"));
  }
  return absl::OkStatus();
}

// The size of a message on the wire (frame length, header, tensor bytes),
// counted the same way whatever the transport.
int64_t MessageBytes(const google::protobuf::Message& header, const std::vector<torch::Tensor>& tensors) {
  return static_cast<int64_t>(sizeof(uint32_t) + header.ByteSizeLong() + TensorBytes(tensors));
}

// Writes `counters` into a request that bumps them once its updates are in
// (ApplyGradientsRequest, AccumulateRequest).
template <typename Request>
void AddCounters(const std::vector<CounterDelta>& counters, Request* request) {
  for (const CounterDelta& c : counters) {
    auto* delta = request->add_counters();
    delta->set_name(c.name);
    delta->set_delta(c.delta);
  }
}

// The ps tasks of `channels`, in index order: each holds a shard of every table.
std::vector<TaskId> PsTasksOf(const std::map<TaskId, std::shared_ptr<Channel>>& channels) {
  std::vector<TaskId> ps;
  for (const auto& [task, channel] : channels) {
    if (task.job == "ps") ps.push_back(task);  // the map's order: by index within a job
  }
  return ps;
}

// What the tasks an update reached say of its places, as one answer: the
// least watermark (where the sender's next update begins), applied where
// every task applied, and a lease lost where any said so.
template <typename Calls, typename ProgressOf>
wire::ProgressAnswer GatherProgress(const Calls& calls, const ProgressOf& progress_of) {
  std::optional<wire::ProgressAnswer> gathered;
  for (const auto& [task, call] : calls) {
    const wire::ProgressAnswer& answer = progress_of(call.response.header);
    gathered = gathered.has_value() ? CombineProgress(*gathered, answer) : answer;
  }
  return gathered.value_or(wire::ProgressAnswer());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClusterSpec& cluster, Transport* transport,
                                                       std::shared_ptr<const Placement> placement,
                                                       ClientOptions options) {
  std::map<TaskId, std::shared_ptr<Channel>> channels;
  for (const TaskId& task : cluster.AllTasks()) {
    SHOAL_ASSIGN_OR_RETURN(std::string address, cluster.AddressOf(task));
    SHOAL_ASSIGN_OR_RETURN(channels[task], transport->Connect(task, address));
  }
  return std::unique_ptr<Client>(new Client(std::move(channels), std::move(placement), options));
}

Client::Client(std::map<TaskId, std::shared_ptr<Channel>> channels, std::shared_ptr<const Placement> placement,
               ClientOptions options, std::shared_ptr<RequestNumbers> numbers)
    : channels_(std::move(channels)),
      placement_(std::move(placement)),
      options_(options),
      numbers_(numbers ? std::move(numbers) : std::make_shared<RequestNumbers>()) {}

std::unique_ptr<Client> Client::WithTimeout(absl::Duration rpc_timeout) const {
  ClientOptions options = options_;
  options.rpc_timeout = rpc_timeout;
  return std::unique_ptr<Client>(new Client(channels_, placement_, options, numbers_));
}

absl::StatusOr<Channel*> Client::ChannelFor(const TaskId& task) const {
  auto it = channels_.find(task);
  if (it == channels_.end()) return absl::NotFoundError(absl::StrCat(task.ToString(), " is not in the cluster"));
  return it->second.get();
}

absl::StatusOr<std::vector<VariablePlacement>> Client::LocateAll(const std::vector<std::string>& names) const {
  std::vector<VariablePlacement> placements;
  placements.reserve(names.size());
  for (const std::string& name : names) {
    SHOAL_ASSIGN_OR_RETURN(VariablePlacement vp, placement_->Locate(name));
    placements.push_back(std::move(vp));
  }
  return placements;
}

uint64_t Client::RequestNumbers::Open() {
  std::lock_guard lock(mu);
  const uint64_t id = next++;
  open.insert(id);
  return id;
}

void Client::RequestNumbers::Close(uint64_t id) {
  std::lock_guard lock(mu);
  open.erase(id);
}

void Client::RequestNumbers::Report(wire::RequestHeader* header) {
  std::lock_guard lock(mu);
  header->clear_unfinished_ids();
  uint64_t known_below = next;
  for (uint64_t id : open) {
    if (static_cast<size_t>(header->unfinished_ids_size()) == kMaxReported) {
      known_below = id;  // the ones from here on go unsaid
      break;
    }
    header->add_unfinished_ids(id);
  }
  header->set_known_below_id(known_below);
  header->set_first_unfinished_id(open.empty() ? known_below : *open.begin());
}

uint64_t Client::RequestNumbers::DrawClientId() {
  std::random_device device;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{device()} << 32) ^ device();
  return id;
}

absl::Status Client::RunAll(TaskCalls& calls, absl::Duration answer_timeout) {
  const absl::Time retry_until = absl::Now() + options_.rpc_timeout;
  const absl::Time deadline = absl::Now() + std::max(options_.rpc_timeout, answer_timeout);
  std::vector<std::pair<Channel*, TaskCall*>> pending;
  for (auto& [task, call] : calls) {
    SHOAL_ASSIGN_OR_RETURN(Channel* channel, ChannelFor(task));
    pending.emplace_back(channel, &call);
  }
  // Numbered only once every call has a channel: each number opened here is
  // closed below, or the servers could never forget this client's requests.
  for (auto& [channel, call] : pending) {
    call->request.header.set_client_id(numbers_->client_id);
    call->request.header.set_request_id(numbers_->Open());
  }
  // A call that found its task unreachable (a dropped connection, a task
  // still starting) is sent again, with the same number, until rpc_timeout:
  // servers apply a numbered request once, so a retry never doubles an update.
  const absl::Time start = absl::Now();
  absl::Duration backoff = absl::Milliseconds(20);
  absl::Status first_error;
  for (int attempt = 1;; ++attempt) {
    std::vector<absl::Status> statuses(pending.size());
    absl::BlockingCounter answered(static_cast<int>(pending.size()));
    for (size_t i = 0; i < pending.size(); ++i) {
      auto [channel, call] = pending[i];
      numbers_->Report(&call->request.header);
      call->response = Response();
      channel->Call(call->request, &call->response, deadline, [&, i](absl::Status status) {
        statuses[i] = std::move(status);
        answered.DecrementCount();
      });
    }
    answered.Wait();  // each transport enforces `deadline`
    std::vector<std::pair<Channel*, TaskCall*>> again;
    const bool time_left = absl::Now() + backoff < retry_until;
    for (size_t i = 0; i < pending.size(); ++i) {
      if (absl::IsUnavailable(statuses[i]) && time_left) {
        again.push_back(pending[i]);
      } else if (!statuses[i].ok() && first_error.ok()) {
        first_error = statuses[i];
        if (attempt > 1 && absl::IsUnavailable(first_error)) {
          first_error = absl::UnavailableError(absl::StrCat(first_error.message(), " (still, after ", attempt,
                                                            " tries in ", absl::FormatDuration(absl::Now() - start),
                                                            ")"));
        }
      }
    }
    if (again.empty()) break;
    retries_.fetch_add(static_cast<int64_t>(again.size()), std::memory_order_relaxed);
    pending = std::move(again);
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
  requests_sent_.fetch_add(static_cast<int64_t>(calls.size()), std::memory_order_relaxed);
  for (auto& [task, call] : calls) {
    numbers_->Close(call.request.header.request_id());
    bytes_sent_.fetch_add(MessageBytes(call.request.header, call.request.tensors), std::memory_order_relaxed);
    bytes_received_.fetch_add(MessageBytes(call.response.header, call.response.tensors), std::memory_order_relaxed);
    tensor_bytes_sent_.fetch_add(TensorBytes(call.request.tensors), std::memory_order_relaxed);
    const uint64_t incarnation = call.response.header.incarnation();
    if (incarnation == 0) continue;  // no answer from the server
    absl::MutexLock lock(&incarnation_mu_);
    auto [known, first] = incarnations_.emplace(task, incarnation);
    if (!first && known->second != incarnation) {
      known->second = incarnation;
      restarts_seen_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return first_error;
}

absl::Status Client::CreateVariables(const std::vector<VariableInit>& variables) {
  std::vector<std::string> names;
  std::vector<torch::Tensor> values;
  for (const auto& v : variables) {
    names.push_back(v.name);
    values.push_back(v.value);
  }
  TaskCalls calls;
  SHOAL_RETURN_IF_ERROR(AddPerShard(
      names, values, "create",
      [&](wire::RequestHeader& h, const std::string& stored_name, size_t i, const torch::Tensor& piece) {
        wire::VariableDef* def = h.mutable_create_variables()->add_variables();
        def->set_name(stored_name);
        for (int64_t d : piece.sizes()) def->add_shape(d);
        *def->mutable_optimizer() = variables[i].optimizer;
        def->set_use_locking(variables[i].use_locking);
        def->set_buffer(variables[i].buffer);
        // An unknown dtype is left unset here; the server refuses the value.
        def->set_dtype(WireDType(piece.scalar_type()).value_or(wire::DTYPE_FLOAT32));
      },
      &calls));
  return RunAll(calls);
}

absl::StatusOr<std::vector<bool>> Client::VariablesExist(const std::vector<std::string>& names) {
  SHOAL_ASSIGN_OR_RETURN(auto placements, LocateAll(names));
  TaskCalls calls;
  for (size_t i = 0; i < placements.size(); ++i) {
    for (const Shard& shard : placements[i].shards) {
      calls[shard.task].request.header.mutable_lookup()->add_names(shard.stored_name);
      calls[shard.task].pieces.emplace_back(i, 0);
    }
  }
  SHOAL_RETURN_IF_ERROR(RunAll(calls));
  std::vector<bool> exist(names.size(), true);
  for (auto& [task, call] : calls) {
    const auto& lookup = call.response.header.lookup();
    if (lookup.present_size() != static_cast<int>(call.pieces.size())) {
      return absl::DataLossError(absl::StrCat(task.ToString(), " answered a lookup of ", call.pieces.size(),
                                              " variables with ", lookup.present_size(), " answers"));
    }
    for (int k = 0; k < lookup.present_size(); ++k) {
      if (!lookup.present(k)) exist[call.pieces[k].first] = false;
    }
  }
  return exist;
}

namespace {

// Polls `client.VariablesExist(names)` with backoff until `done` accepts an
// answer, or fails: a NOT_FOUND answer (a name no task holds) at once, else
// DEADLINE_EXCEEDED after `timeout`, "waited T for <what>; <why>", where
// `done` said why it did not accept the last answer.
using AcceptFn = std::function<bool(const absl::StatusOr<std::vector<bool>>&, std::string* why)>;
absl::Status PollLookups(Client& client, const std::vector<std::string>& names, absl::Duration timeout,
                         absl::string_view what, const AcceptFn& done) {
  const absl::Time give_up = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(20);
  while (true) {
    auto exist = client.VariablesExist(names);
    if (absl::IsNotFound(exist.status())) return exist.status();
    std::string why;
    if (done(exist, &why)) return absl::OkStatus();
    if (absl::Now() + backoff > give_up) {
      return absl::DeadlineExceededError(absl::StrCat("waited ", absl::FormatDuration(timeout), " for ", what, "; ", why));
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
}

std::string LastError(const absl::Status& status) { return absl::StrCat("last error: ", status.message()); }

}  // namespace

absl::Status Client::WaitForVariables(const std::vector<std::string>& names, absl::Duration timeout) {
  return PollLookups(*this, names, timeout, "the chief to create the variables",
                     [&](const absl::StatusOr<std::vector<bool>>& exist, std::string* why) {
                       if (!exist.ok()) {
                         *why = LastError(exist.status());
                         return false;
                       }
                       for (size_t i = 0; i < names.size(); ++i) {
                         if (!(*exist)[i]) {
                           *why = absl::StrCat("still missing variable '", names[i], "'");
                           return false;
                         }
                       }
                       return true;
                     });
}

absl::Status Client::WaitForTasksHolding(const std::vector<std::string>& names, absl::Duration timeout) {
  return PollLookups(*this, names, timeout, "the tasks that hold the variables to start",
                     [](const absl::StatusOr<std::vector<bool>>& exist, std::string* why) {
                       if (!exist.ok()) *why = LastError(exist.status());
                       return exist.ok();  // an answer from every task, whatever it says
                     });
}

absl::Status Client::ReadShards(const std::vector<std::string>& names,
                                const std::function<void(wire::ReadRequest*)>& configure,
                                std::vector<VariablePlacement>* placements, TaskCalls* calls) {
  SHOAL_ASSIGN_OR_RETURN(*placements, LocateAll(names));
  for (size_t i = 0; i < names.size(); ++i) {
    for (size_t s = 0; s < (*placements)[i].shards.size(); ++s) {
      TaskCall& call = (*calls)[(*placements)[i].shards[s].task];
      call.request.header.mutable_read()->add_names((*placements)[i].shards[s].stored_name);
      call.pieces.emplace_back(i, s);
    }
  }
  for (auto& [task, call] : *calls) configure(call.request.header.mutable_read());
  return RunAll(*calls);
}

absl::StatusOr<std::vector<torch::Tensor>> Client::Reassemble(const std::vector<VariablePlacement>& placements,
                                                              TaskCalls& calls) const {
  std::vector<std::vector<torch::Tensor>> parts(placements.size());
  for (size_t i = 0; i < placements.size(); ++i) parts[i].resize(placements[i].shards.size());
  for (auto& [task, call] : calls) {
    if (call.response.tensors.size() != call.pieces.size()) {
      return absl::DataLossError(absl::StrCat(task.ToString(), " answered a read of ", call.pieces.size(),
                                              " variables with ", call.response.tensors.size(), " tensors"));
    }
    for (size_t k = 0; k < call.pieces.size(); ++k) {
      parts[call.pieces[k].first][call.pieces[k].second] = std::move(call.response.tensors[k]);
    }
  }
  std::vector<torch::Tensor> values;
  values.reserve(placements.size());
  for (auto& p : parts) values.push_back(p.size() == 1 ? std::move(p[0]) : torch::cat(p, 0));
  return values;
}

absl::StatusOr<std::vector<torch::Tensor>> Client::Read(const std::vector<std::string>& names) {
  std::vector<VariablePlacement> placements;
  TaskCalls calls;
  SHOAL_RETURN_IF_ERROR(ReadShards(names, [](wire::ReadRequest*) {}, &placements, &calls));
  return Reassemble(placements, calls);
}

absl::StatusOr<Client::StepValues> Client::ReadAtStep(const std::vector<std::string>& names, int64_t min_step,
                                                      absl::Duration wait) {
  if (min_step < 1) return absl::InvalidArgumentError(absl::StrCat("ReadAtStep: min_step ", min_step, " is not a step"));
  std::vector<VariablePlacement> placements;
  TaskCalls calls;
  SHOAL_RETURN_IF_ERROR(ReadShards(
      names,
      [&](wire::ReadRequest* read) {
        read->set_min_step(min_step);
        read->set_wait_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(wait)));
      },
      &placements, &calls));
  StepValues result;
  result.step = INT64_MAX;
  for (auto& [task, call] : calls) {
    const wire::ReadResponse& read = call.response.header.read();
    if (read.pending()) {
      result.heard_from.assign(read.contributors().begin(), read.contributors().end());
      return result;
    }
    for (int64_t step : read.steps()) result.step = std::min(result.step, step);
  }
  if (calls.empty()) result.step = min_step;
  SHOAL_ASSIGN_OR_RETURN(result.values, Reassemble(placements, calls));
  result.ready = true;
  return result;
}

absl::Status Client::AddPerShard(const std::vector<std::string>& names, const std::vector<torch::Tensor>& tensors,
                                absl::string_view what, const AddName& add_name, TaskCalls* calls,
                                std::vector<VariablePlacement>* placements_out) const {
  if (names.size() != tensors.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", names.size(), " names but ", tensors.size(), " tensors"));
  }
  SHOAL_ASSIGN_OR_RETURN(auto placements, LocateAll(names));
  for (size_t i = 0; i < names.size(); ++i) {
    SHOAL_RETURN_IF_ERROR(CheckPartitionedShape(names[i], placements[i], tensors[i]));
    for (size_t s = 0; s < placements[i].shards.size(); ++s) {
      const Shard& shard = placements[i].shards[s];
      TaskCall& call = (*calls)[shard.task];
      torch::Tensor piece = Slice(tensors[i], placements[i], shard);
      add_name(call.request.header, shard.stored_name, i, piece);
      call.request.tensors.push_back(std::move(piece));
      call.pieces.emplace_back(i, s);
    }
  }
  if (placements_out != nullptr) *placements_out = std::move(placements);
  return absl::OkStatus();
}

absl::Status Client::Assign(const std::vector<std::string>& names, const std::vector<torch::Tensor>& values,
                            std::optional<int64_t> accumulator_step) {
  TaskCalls calls;
  SHOAL_RETURN_IF_ERROR(AddPerShard(names, values, "assign",
                                    [&](wire::RequestHeader& h, const std::string& name, size_t, const torch::Tensor&) {
                                      h.mutable_assign()->add_names(name);
                                      if (accumulator_step.has_value()) {
                                        h.mutable_assign()->set_reset_accumulators(true);
                                        h.mutable_assign()->set_accumulator_step(*accumulator_step);
                                      }
                                    },
                                    &calls));
  return RunAll(calls);
}

absl::StatusOr<int64_t> Client::SetCounter(const std::string& name, int64_t value) {
  wire::CounterRequest request;
  request.mutable_counter()->set_name(name);
  request.mutable_counter()->set_delta(value);
  request.set_assign(true);
  return CallCounter(request);
}

absl::StatusOr<std::vector<int64_t>> Client::ApplyGradients(const std::vector<std::string>& names,
                                                           const std::vector<torch::Tensor>& gradients,
                                                           const std::vector<CounterDelta>& counters,
                                                           const wire::DataProgress* progress,
                                                           wire::ProgressAnswer* answer) {
  return Update(wire::UPDATE_OPTIMIZER, names, gradients, counters, /*values=*/nullptr, /*elastic_alpha=*/0, progress,
                answer);
}

absl::StatusOr<Client::AppliedValues> Client::ApplyGradientsAndRead(const std::vector<std::string>& names,
                                                                   const std::vector<torch::Tensor>& gradients,
                                                                   const std::vector<CounterDelta>& counters,
                                                                   const wire::DataProgress* progress,
                                                                   wire::ProgressAnswer* answer) {
  AppliedValues applied;
  SHOAL_ASSIGN_OR_RETURN(applied.counters, Update(wire::UPDATE_OPTIMIZER, names, gradients, counters, &applied.values,
                                                  /*elastic_alpha=*/0, progress, answer));
  return applied;
}

absl::StatusOr<std::vector<int64_t>> Client::AddToVariables(const std::vector<std::string>& names,
                                                           const std::vector<torch::Tensor>& deltas,
                                                           const std::vector<CounterDelta>& counters) {
  return Update(wire::UPDATE_ADD, names, deltas, counters);
}

absl::StatusOr<Client::AppliedValues> Client::AddToVariablesAndRead(const std::vector<std::string>& names,
                                                                   const std::vector<torch::Tensor>& deltas,
                                                                   const std::vector<CounterDelta>& counters) {
  AppliedValues added;
  SHOAL_ASSIGN_OR_RETURN(added.counters, Update(wire::UPDATE_ADD, names, deltas, counters, &added.values));
  return added;
}

absl::StatusOr<Client::AppliedValues> Client::MoveTowards(const std::vector<std::string>& names,
                                                         const std::vector<torch::Tensor>& copies, double alpha,
                                                         const std::vector<CounterDelta>& counters,
                                                         const wire::DataProgress* progress,
                                                         wire::ProgressAnswer* answer) {
  AppliedValues moved;
  SHOAL_ASSIGN_OR_RETURN(moved.counters, Update(wire::UPDATE_ELASTIC, names, copies, counters, &moved.values, alpha,
                                                progress, answer));
  return moved;
}

absl::StatusOr<std::vector<int64_t>> Client::Update(wire::UpdateRule rule, const std::vector<std::string>& names,
                                                   const std::vector<torch::Tensor>& updates,
                                                   const std::vector<CounterDelta>& counters,
                                                   std::vector<torch::Tensor>* values, double elastic_alpha,
                                                   const wire::DataProgress* progress, wire::ProgressAnswer* answer) {
  TaskCalls calls;
  std::vector<VariablePlacement> placements;
  SHOAL_RETURN_IF_ERROR(AddPerShard(names, updates, "apply",
                                    [rule, values, elastic_alpha](wire::RequestHeader& h, const std::string& name,
                                                                  size_t, const torch::Tensor&) {
                                      auto* apply = h.mutable_apply_gradients();
                                      apply->add_names(name);
                                      apply->set_rule(rule);
                                      // (an elastic update answers with the values before it)
                                      apply->set_read_after(values != nullptr && rule != wire::UPDATE_ELASTIC);
                                      if (rule == wire::UPDATE_ELASTIC) apply->set_elastic_alpha(elastic_alpha);
                                    },
                                    &calls, &placements));
  // The counters ride with the gradients to the counter task.
  if (!counters.empty()) {
    AddCounters(counters, calls[placement_->counter_task()].request.header.mutable_apply_gradients());
  }
  if (progress != nullptr) {
    calls[placement_->counter_task()].request.header.mutable_apply_gradients();  // the lease's holder hears of it
    for (auto& [task, call] : calls) *call.request.header.mutable_apply_gradients()->mutable_progress() = *progress;
  }
  SHOAL_RETURN_IF_ERROR(RunAll(calls));
  if (answer != nullptr) {
    *answer = GatherProgress(calls, [](const wire::ResponseHeader& h) { return h.apply_gradients().progress(); });
  }
  if (values != nullptr) {
    SHOAL_ASSIGN_OR_RETURN(*values, Reassemble(placements, calls));
  }
  if (counters.empty()) return std::vector<int64_t>();
  const auto& counted = calls[placement_->counter_task()].response.header.apply_gradients().counter_values();
  return std::vector<int64_t>(counted.begin(), counted.end());
}

absl::StatusOr<int64_t> Client::CallCounter(const wire::CounterRequest& request) {
  TaskCalls calls;
  *calls[placement_->counter_task()].request.header.mutable_counter() = request;
  SHOAL_RETURN_IF_ERROR(RunAll(calls));
  return calls.begin()->second.response.header.counter().value();
}

absl::StatusOr<int64_t> Client::AddToCounter(const std::string& name, int64_t delta) {
  wire::CounterRequest request;
  request.mutable_counter()->set_name(name);
  request.mutable_counter()->set_delta(delta);
  return CallCounter(request);
}

absl::StatusOr<std::vector<int64_t>> Client::AddToCounters(const std::vector<CounterDelta>& counters) {
  if (counters.empty()) return std::vector<int64_t>();
  // An update of no variables: its counters are all it carries.
  return Update(wire::UPDATE_OPTIMIZER, {}, {}, counters);
}

absl::StatusOr<int64_t> Client::PollCounter(const std::string& name, int64_t at_least, absl::Duration wait) {
  wire::CounterRequest request;
  request.mutable_counter()->set_name(name);
  request.set_wait_until_at_least(at_least);
  request.set_wait_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(wait)));
  return CallCounter(request);
}

absl::StatusOr<int> Client::Accumulate(const std::vector<std::string>& names,
                                       const std::vector<torch::Tensor>& gradients, int64_t local_step,
                                       const std::string& worker, int apply_at,
                                       const std::vector<CounterDelta>& counters,
                                       const wire::DataProgress* progress, wire::ProgressAnswer* answer) {
  TaskCalls calls;
  auto describe = [&](wire::AccumulateRequest* accumulate) {
    accumulate->set_local_step(local_step);
    accumulate->set_worker(worker);
    accumulate->set_apply_at(apply_at);
  };
  SHOAL_RETURN_IF_ERROR(AddPerShard(names, gradients, "accumulate",
                                    [&](wire::RequestHeader& h, const std::string& name, size_t, const torch::Tensor&) {
                                      auto* accumulate = h.mutable_accumulate();
                                      accumulate->add_names(name);
                                      describe(accumulate);
                                    },
                                    &calls));
  if (!counters.empty()) {
    auto* accumulate = calls[placement_->counter_task()].request.header.mutable_accumulate();
    describe(accumulate);
    AddCounters(counters, accumulate);
  }
  if (progress != nullptr) {
    describe(calls[placement_->counter_task()].request.header.mutable_accumulate());
    for (auto& [task, call] : calls) *call.request.header.mutable_accumulate()->mutable_progress() = *progress;
  }
  SHOAL_RETURN_IF_ERROR(RunAll(calls));
  if (answer != nullptr) {
    *answer = GatherProgress(calls, [](const wire::ResponseHeader& h) { return h.accumulate().progress(); });
  }
  int dropped = 0;
  for (auto& [task, call] : calls) {
    for (bool accepted : call.response.header.accumulate().accepted()) dropped += accepted ? 0 : 1;
  }
  return dropped;
}

absl::StatusOr<wire::LeaseResponse> Client::Lease(const wire::LeaseRequest& request) {
  TaskCalls calls;
  *calls[placement_->counter_task()].request.header.mutable_lease() = request;
  SHOAL_RETURN_IF_ERROR(RunAll(calls));
  return calls.begin()->second.response.header.lease();
}

absl::StatusOr<wire::LeaseTableState> Client::LeaseTable(const wire::LeaseTableState* restore,
                                                         const MarksOf& marks_of) {
  TaskCalls calls;
  auto restore_onto = [&](const TaskId& task) {
    auto* request = calls[task].request.header.mutable_lease_table();
    request->set_restore(true);
    *request->mutable_state() = *restore;
    const wire::TaskMarks* own = marks_of ? marks_of(task) : nullptr;
    if (own != nullptr) *request->mutable_marks() = *own;
  };
  if (restore != nullptr) {
    // Every task's watermarks go back with the table (its variables', and
    // the rows' of any table shard it holds: every ps task); the counter
    // task's last.
    std::set<TaskId> tasks = VariableTasks();
    for (const TaskId& task : PsTasksOf(channels_)) tasks.insert(task);
    for (const TaskId& task : tasks) {
      if (task != placement_->counter_task()) restore_onto(task);
    }
    SHOAL_RETURN_IF_ERROR(RunAll(calls));
    calls.clear();
  }
  auto* request = calls[placement_->counter_task()].request.header.mutable_lease_table();
  if (restore != nullptr) {
    restore_onto(placement_->counter_task());
    request->set_hands_out_leases(true);
  }
  SHOAL_RETURN_IF_ERROR(RunAll(calls));
  return calls.begin()->second.response.header.lease_table().state();
}

std::set<TaskId> Client::VariableTasks() const {
  std::set<TaskId> tasks;
  for (const auto& [name, placed] : placement_->variables()) {
    for (const Shard& shard : placed.shards) tasks.insert(shard.task);
  }
  return tasks;
}

absl::StatusOr<std::vector<wire::LedgerResponse>> Client::Ledgers() {
  TaskCalls calls;
  std::set<TaskId> variable_tasks;
  for (const TaskId& task : VariableTasks()) variable_tasks.insert(task);
  variable_tasks.insert(placement_->counter_task());
  for (const TaskId& task : variable_tasks) calls[task].request.header.mutable_ledger();
  // Tables are sharded over every ps task, and each task answers a ledger
  // for each table it holds (every shard of a table hears of every batch).
  for (const TaskId& task : PsTasksOf(channels_)) calls[task].request.header.mutable_ledger();
  SHOAL_RETURN_IF_ERROR(RunAll(calls));
  std::vector<wire::LedgerResponse> ledgers;
  for (auto& [task, call] : calls) {
    const wire::LedgerResponse& ledger = call.response.header.ledger();
    if (variable_tasks.count(task) != 0) {
      ledgers.emplace_back();
      *ledgers.back().mutable_epochs() = ledger.epochs();
    }
    for (const wire::TableLedger& table : ledger.tables()) {
      ledgers.emplace_back();
      *ledgers.back().mutable_epochs() = table.epochs();
      ledgers.back().add_tables()->set_table(table.table());  // says whose it is
    }
  }
  return ledgers;
}

wire::ProgressAnswer CombineProgress(const wire::ProgressAnswer& a, const wire::ProgressAnswer& b) {
  wire::ProgressAnswer combined;
  combined.set_watermark(std::min(a.watermark(), b.watermark()));
  combined.set_applied(a.applied() && b.applied());
  combined.set_lease_lost(a.lease_lost() || b.lease_lost());
  combined.set_live_workers(std::max(a.live_workers(), b.live_workers()));  // the counter task's
  return combined;
}

absl::Status IncompleteStepError(int64_t step, int arrived, int replicas, absl::Duration timeout,
                                 const std::vector<std::string>& workers, const std::vector<std::string>& heard_from) {
  std::vector<std::string> missing;
  for (const auto& w : workers) {
    if (std::find(heard_from.begin(), heard_from.end(), w) == heard_from.end()) missing.push_back(w);
  }
  return absl::DeadlineExceededError(absl::StrCat("synchronous step ", step, ": only ", arrived, " of ", replicas,
                                                  " gradients arrived within ", absl::FormatDuration(timeout),
                                                  "; missing ", missing.empty() ? "(unknown)" : absl::StrJoin(missing, ", ")));
}

absl::Status Client::ApplyAccumulated(const std::vector<std::string>& names, int replicas_to_aggregate,
                                      int64_t new_step, absl::Duration timeout,
                                      const std::vector<std::string>& workers, wire::AccumulatedRule rule) {
  SHOAL_ASSIGN_OR_RETURN(auto placements, LocateAll(names));
  std::map<TaskId, std::vector<std::string>> pending;  // task -> stored names not yet applied
  for (const auto& vp : placements) {
    for (const Shard& shard : vp.shards) pending[shard.task].push_back(shard.stored_name);
  }
  const absl::Time give_up = absl::Now() + timeout;
  std::vector<std::string> heard_from;
  int fewest = replicas_to_aggregate;
  while (!pending.empty()) {
    TaskCalls calls;
    for (const auto& [task, stored] : pending) {
      auto* apply = calls[task].request.header.mutable_apply_accumulated();
      for (const auto& name : stored) apply->add_names(name);
      apply->set_replicas_to_aggregate(replicas_to_aggregate);
      apply->set_new_step(new_step);
      apply->set_wait_ms(200);
      apply->set_rule(rule);
    }
    SHOAL_RETURN_IF_ERROR(RunAll(calls));
    for (auto& [task, call] : calls) {
      const auto& answer = call.response.header.apply_accumulated();
      if (answer.applied()) {
        pending.erase(task);
        continue;
      }
      heard_from.assign(answer.contributors().begin(), answer.contributors().end());
      for (int count : answer.counts()) fewest = std::min(fewest, count);
    }
    if (!pending.empty() && absl::Now() > give_up) {
      return IncompleteStepError(new_step, fewest, replicas_to_aggregate, timeout, workers, heard_from);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TaskId>> Client::LocateWhole(const std::vector<std::string>& names,
                                                        absl::string_view what) const {
  SHOAL_ASSIGN_OR_RETURN(auto placements, LocateAll(names));
  std::vector<TaskId> tasks;
  for (size_t i = 0; i < names.size(); ++i) {
    if (placements[i].partitioned()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " of partitioned variable '", names[i], "' is not supported"));
    }
    tasks.push_back(placements[i].shards[0].task);
  }
  return tasks;
}

absl::Status Client::SetOptimizer(const std::vector<std::string>& names, const wire::OptimizerConfig& optimizer) {
  SHOAL_ASSIGN_OR_RETURN(auto tasks, LocateWhole(names, "set_optimizer"));
  TaskCalls calls;
  for (size_t i = 0; i < names.size(); ++i) {
    auto* request = calls[tasks[i]].request.header.mutable_set_optimizer();
    request->add_names(names[i]);
    *request->mutable_optimizer() = optimizer;
  }
  return RunAll(calls);
}

absl::StatusOr<std::vector<OptimizerSlots>> Client::ReadSlots(const std::vector<std::string>& names) {
  SHOAL_ASSIGN_OR_RETURN(auto tasks, LocateWhole(names, "read_slots"));
  TaskCalls calls;
  for (size_t i = 0; i < names.size(); ++i) {
    calls[tasks[i]].request.header.mutable_read_slots()->add_names(names[i]);
    calls[tasks[i]].pieces.emplace_back(i, 0);
  }
  SHOAL_RETURN_IF_ERROR(RunAll(calls));
  std::vector<OptimizerSlots> slots(names.size());
  for (auto& [task, call] : calls) {
    const auto& answer = call.response.header.read_slots();
    if (answer.counts_size() != static_cast<int>(call.pieces.size()) || answer.steps_size() != answer.counts_size()) {
      return absl::DataLossError(absl::StrCat(task.ToString(), " answered a read_slots malformed"));
    }
    size_t next = 0;
    for (size_t k = 0; k < call.pieces.size(); ++k) {
      OptimizerSlots& out = slots[call.pieces[k].first];
      for (int j = 0; j < answer.counts(k); ++j) {
        if (next >= call.response.tensors.size()) {
          return absl::DataLossError(absl::StrCat(task.ToString(), " sent fewer slot tensors than it counted"));
        }
        out.tensors.push_back(std::move(call.response.tensors[next++]));
      }
      out.step = answer.steps(k);
    }
  }
  return slots;
}

absl::Status Client::AssignSlots(const std::vector<std::string>& names, const std::vector<OptimizerSlots>& slots) {
  if (slots.size() != names.size()) {
    return absl::InvalidArgumentError(absl::StrCat("assign_slots: ", names.size(), " names but ", slots.size(),
                                                   " slot sets"));
  }
  SHOAL_ASSIGN_OR_RETURN(auto placements, LocateAll(names));
  TaskCalls calls;
  for (size_t i = 0; i < names.size(); ++i) {
    // Slots have their variable's shape, so a partition takes its rows of each.
    for (const auto& t : slots[i].tensors) SHOAL_RETURN_IF_ERROR(CheckPartitionedShape(names[i], placements[i], t));
    for (const Shard& shard : placements[i].shards) {
      TaskCall& call = calls[shard.task];
      auto* request = call.request.header.mutable_assign_slots();
      request->add_names(shard.stored_name);
      request->add_counts(static_cast<int>(slots[i].tensors.size()));
      request->add_steps(slots[i].step);
      for (const auto& t : slots[i].tensors) call.request.tensors.push_back(Slice(t, placements[i], shard));
    }
  }
  return RunAll(calls);
}

absl::StatusOr<std::map<TaskId, Client::SavedShard>> Client::SaveShards(const std::map<TaskId, int>& shards,
                                                                        int64_t step, int64_t marks_from_epoch,
                                                                        const std::string& step_counter) {
  TaskCalls calls;
  for (const auto& [task, shard] : shards) {
    auto* save = calls[task].request.header.mutable_save_shard();
    save->set_step(step);
    save->set_shard(shard);
    save->set_marks_from_epoch(marks_from_epoch);
    if (task == placement_->counter_task()) save->set_step_counter(step_counter);
  }
  SHOAL_RETURN_IF_ERROR(RunAll(calls, options_.checkpoint_timeout));
  std::map<TaskId, SavedShard> saved;
  for (const auto& [task, call] : calls) {
    const auto& answer = call.response.header.save_shard();
    saved[task] = SavedShard{{answer.names().begin(), answer.names().end()}, answer.path(), answer.wrote_tables(),
                             answer.marks()};
  }
  return saved;
}

absl::Status Client::Shutdown(const TaskId& task) {
  TaskCalls calls;
  calls[task].request.header.mutable_shutdown();
  return RunAll(calls);
}

absl::StatusOr<std::vector<TaskId>> Client::TableShards() const {
  std::vector<TaskId> shards = PsTasksOf(channels_);
  if (shards.empty()) return absl::FailedPreconditionError("the cluster has no ps task to hold embedding tables");
  return shards;
}

absl::Status Client::CreateTables(const std::vector<wire::TableDef>& tables) {
  SHOAL_ASSIGN_OR_RETURN(const std::vector<TaskId> shards, TableShards());
  TaskCalls calls;
  for (size_t s = 0; s < shards.size(); ++s) {
    auto* create = calls[shards[s]].request.header.mutable_create_tables();
    for (const wire::TableDef& table : tables) {
      wire::TableDef* def = create->add_tables();
      *def = table;
      def->set_shard(static_cast<int32_t>(s));
      def->set_num_shards(static_cast<int32_t>(shards.size()));
    }
  }
  return RunAll(calls);
}

absl::StatusOr<int64_t> Client::RestoreTables(int64_t step, const std::vector<int>& shards) {
  SHOAL_ASSIGN_OR_RETURN(const std::vector<TaskId> tasks, TableShards());
  TaskCalls calls;
  for (const TaskId& task : tasks) {
    auto* restore = calls[task].request.header.mutable_restore_tables();
    restore->set_step(step);
    for (int shard : shards) restore->add_shards(shard);
  }
  SHOAL_RETURN_IF_ERROR(RunAll(calls, options_.checkpoint_timeout));
  int64_t rows = 0;
  for (const auto& [task, call] : calls) rows += call.response.header.restore_tables().rows();
  return rows;
}

namespace {

// "float64 [1,4] on cpu", for errors.
std::string Describe(const torch::Tensor& t) {
  if (!t.defined()) return "nothing";
  return absl::StrCat(DTypeName(t.scalar_type()), " [", absl::StrJoin(t.sizes(), ","), "] on ", t.device().str());
}

// Checks that `ids` is a 1-D int64 CPU tensor (and `gradients`, if given, a
// float32 CPU tensor with a row per id); names the table and what was given.
absl::Status CheckRowRequest(const std::string& table, const torch::Tensor& ids, const torch::Tensor* gradients) {
  if (!ids.defined() || ids.scalar_type() != torch::kInt64 || ids.dim() != 1 || !ids.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ids for table '", table, "' must be a 1-D int64 CPU tensor, not ", Describe(ids)));
  }
  if (gradients != nullptr && (!gradients->defined() || gradients->scalar_type() != torch::kFloat32 ||
                                gradients->dim() != 2 || gradients->size(0) != ids.size(0) ||
                                !gradients->device().is_cpu())) {
    return absl::InvalidArgumentError(absl::StrCat("gradients for table '", table,
                                                   "' must be float32 on the CPU with one row per id (", ids.size(0),
                                                   " ids), got ", Describe(*gradients)));
  }
  return absl::OkStatus();
}

// For each of `shards`, the positions in `unique_ids` of the ids it holds
// (id mod shards, wrapped for ids below zero).
std::vector<torch::Tensor> PositionsByShard(const torch::Tensor& unique_ids, int64_t shards) {
  const torch::Tensor shard_of = torch::remainder(unique_ids, shards);  // the divisor's sign: in [0, shards)
  std::vector<torch::Tensor> positions(shards);
  for (int64_t s = 0; s < shards; ++s) positions[s] = torch::nonzero(shard_of == s).flatten();
  return positions;
}

}  // namespace

absl::StatusOr<torch::Tensor> Client::PullRows(const std::string& table, const torch::Tensor& ids, Ids ids_are) {
  SHOAL_RETURN_IF_ERROR(CheckRowRequest(table, ids, nullptr));
  SHOAL_ASSIGN_OR_RETURN(const std::vector<TaskId> shards, TableShards());
  torch::Tensor unique_ids = ids.contiguous(), inverse;  // inverse: undefined when the ids are distinct
  if (ids_are == Ids::kAny) {
    DistinctIds distinct = FindDistinctIds(ids);
    unique_ids = distinct.values;
    inverse = distinct.inverse;
  }
  const std::vector<torch::Tensor> positions = PositionsByShard(unique_ids, static_cast<int64_t>(shards.size()));
  TaskCalls calls;
  for (size_t s = 0; s < shards.size(); ++s) {
    // No ids at all still asks the first shard, whose empty answer has the
    // table's width (and which refuses an unknown table).
    if (positions[s].numel() == 0 && (s > 0 || unique_ids.numel() > 0)) continue;
    TaskCall& call = calls[shards[s]];
    call.request.header.mutable_pull_rows()->set_table(table);
    call.request.tensors.push_back(unique_ids.index_select(0, positions[s]));
    call.pieces.emplace_back(s, 0);
  }
  SHOAL_RETURN_IF_ERROR(RunAll(calls));
  torch::Tensor unique_rows;
  for (auto& [task, call] : calls) {
    const size_t s = call.pieces[0].first;
    if (call.response.tensors.size() != 1 || call.response.tensors[0].dim() != 2 ||
        call.response.tensors[0].size(0) != positions[s].numel()) {
      return absl::DataLossError(absl::StrCat(task.ToString(), " answered a pull of ", positions[s].numel(),
                                              " rows of table '", table, "' with something else"));
    }
    const torch::Tensor& rows = call.response.tensors[0];
    if (!unique_rows.defined()) unique_rows = torch::empty({unique_ids.size(0), rows.size(1)}, rows.options());
    unique_rows.index_copy_(0, positions[s], rows);
  }
  if (!unique_rows.defined()) {
    return absl::InternalError(absl::StrCat("no ps task answered a pull of table '", table, "'"));
  }
  return inverse.defined() ? unique_rows.index_select(0, inverse) : unique_rows;
}

absl::StatusOr<Client::TableOccupancy> Client::Occupancy(const std::string& table) {
  SHOAL_ASSIGN_OR_RETURN(const std::vector<TaskId> shards, TableShards());
  TaskCalls calls;
  for (const TaskId& shard : shards) {
    TaskCall& call = calls[shard];
    call.request.header.mutable_pull_rows()->set_table(table);
    call.request.tensors.push_back(torch::empty({0}, torch::kInt64));  // no rows: the figures alone
  }
  SHOAL_RETURN_IF_ERROR(RunAll(calls));
  TableOccupancy total;
  for (const auto& [task, call] : calls) {
    const wire::PullRowsResponse& answer = call.response.header.pull_rows();
    total.rows_held += answer.rows_held();
    total.ids_refused += answer.ids_refused();
    total.rows_evicted += answer.rows_evicted();
  }
  return total;
}

absl::Status Client::PushRows(const std::string& table, const torch::Tensor& ids, const torch::Tensor& gradients,
                              Ids ids_are, const wire::DataProgress* progress, wire::ProgressAnswer* answer) {
  SHOAL_RETURN_IF_ERROR(CheckRowRequest(table, ids, &gradients));
  SHOAL_ASSIGN_OR_RETURN(const std::vector<TaskId> shards, TableShards());
  if (ids.numel() == 0 && progress == nullptr) return absl::OkStatus();
  torch::Tensor unique_ids = ids.contiguous(), combined = gradients;
  if (ids_are == Ids::kAny) {
    // One gradient row per distinct id: the sum of its rows in the batch.
    auto [distinct, inverse] = FindDistinctIds(ids);
    unique_ids = distinct;
    combined = torch::zeros({distinct.size(0), gradients.size(1)}, gradients.options()).index_add_(0, inverse, gradients);
  }
  const std::vector<torch::Tensor> positions = PositionsByShard(unique_ids, static_cast<int64_t>(shards.size()));
  TaskCalls calls;
  for (size_t s = 0; s < shards.size(); ++s) {
    // On leased data every shard moves its watermark over the batch's places.
    if (positions[s].numel() == 0 && progress == nullptr) continue;
    TaskCall& call = calls[shards[s]];
    call.request.header.mutable_push_rows()->set_table(table);
    if (progress != nullptr) *call.request.header.mutable_push_rows()->mutable_progress() = *progress;
    call.request.tensors.push_back(unique_ids.index_select(0, positions[s]));
    call.request.tensors.push_back(combined.index_select(0, positions[s]));
  }
  SHOAL_RETURN_IF_ERROR(RunAll(calls));
  if (answer != nullptr) {
    *answer = GatherProgress(calls, [](const wire::ResponseHeader& h) { return h.push_rows().progress(); });
  }
  return absl::OkStatus();
}

}  // namespace shoal
