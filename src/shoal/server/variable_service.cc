#include "shoal/server/variable_service.h"

#include <filesystem>
#include <optional>
#include <random>
#include <set>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "shoal/compute/compute_threads.h"
#include "shoal/core/codec.h"
#include "shoal/core/status.h"
#include "shoal/server/table_checkpoint.h"

namespace shoal {
namespace {

// Long polls hold a server thread; keep each short and let callers repeat.
constexpr int64_t kMaxWaitMs = 200;

// FailedPrecondition for a server started without a checkpoint directory,
// which therefore `does` nothing of what was asked.
absl::Status NeedsCheckpointDir(const VariableServiceOptions& options, absl::string_view does) {
  if (!options.checkpoint_dir.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      options.task_name, " was started without a checkpoint directory (checkpoint.dir) and ", does));
}

std::vector<std::string> Names(const google::protobuf::RepeatedPtrField<std::string>& names) {
  return {names.begin(), names.end()};
}

template <typename Field>
void CopyInts(const std::vector<int64_t>& from, Field* to) {
  to->Clear();
  for (int64_t v : from) to->Add(v);
}

// Bounds the work a request can ask for before any of it is done: no list in
// its operation (names, definitions, counters, slot counts) may be longer
// than the most tensors a message may carry.
absl::Status CheckListLengths(const wire::RequestHeader& h, const std::string& task_name) {
  const google::protobuf::Reflection* reflection = h.GetReflection();
  const google::protobuf::FieldDescriptor* op_field =
      reflection->GetOneofFieldDescriptor(h, h.GetDescriptor()->FindOneofByName("op"));
  if (op_field == nullptr) return absl::OkStatus();
  const google::protobuf::Message& op = reflection->GetMessage(h, op_field);
  const google::protobuf::Descriptor* descriptor = op.GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    if (!field->is_repeated()) continue;
    const int length = op.GetReflection()->FieldSize(op, field);
    if (length > kMaxTensorsPerMessage) {
      return absl::ResourceExhaustedError(absl::StrCat(op_field->name(), " request to ", task_name, " lists ", length, " ",
                                                       field->name(), ", more than the ", kMaxTensorsPerMessage,
                                                       " one request may carry"));
    }
  }
  return absl::OkStatus();
}

// The request's operation as the wire names it ("apply_gradients").
std::string OpName(const wire::RequestHeader& h) {
  const auto* field = wire::RequestHeader::descriptor()->FindFieldByNumber(static_cast<int>(h.op_case()));
  return field == nullptr ? "empty" : field->name();
}

using CounterDeltas = google::protobuf::RepeatedPtrField<wire::CounterDelta>;

// The counters a request bumps once its updates are in, checked before any
// update is made: each must have a name.
absl::Status CheckCounterNames(const CounterDeltas& counters, const wire::RequestHeader& h,
                               const std::string& task_name) {
  for (const auto& counter : counters) {
    if (counter.name().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(OpName(h), " request to ", task_name, " bumps a counter that has no name"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ResponseStatus(const wire::ResponseHeader& header) {
  if (header.status_code() == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(header.status_code()), header.status_message());
}

bool VariableService::MayWait(const Request& request) {
  const wire::RequestHeader& h = request.header;
  return (h.has_counter() && h.counter().wait_ms() > 0) ||
         (h.has_apply_accumulated() && h.apply_accumulated().wait_ms() > 0) ||
         (h.has_read() && h.read().min_step() > 0 && h.read().wait_ms() > 0);
}

bool VariableService::TakesLong(const Request& request) {
  const wire::RequestHeader& h = request.header;
  return MayWait(request) || h.has_save_shard() || h.has_restore_tables() || h.has_create_tables();
}

bool VariableService::Changes(const Request& request) {
  const wire::RequestHeader& h = request.header;
  switch (h.op_case()) {
    case wire::RequestHeader::kRead:
    case wire::RequestHeader::kLookup:
    case wire::RequestHeader::kReadSlots:
    case wire::RequestHeader::kEndpoints:
    case wire::RequestHeader::kPullRows:
    case wire::RequestHeader::kLedger:
    case wire::RequestHeader::OP_NOT_SET:
      return false;
    case wire::RequestHeader::kLeaseTable:
      return h.lease_table().restore();
    case wire::RequestHeader::kCounter:
      return h.counter().counter().delta() != 0 || h.counter().assign();
    default:
      return true;
  }
}

namespace {

// What a request says of its client's settled numbers (a client that sends
// only first_unfinished_id says that every number below it is).
SettledNumbers SettledNumbersOf(const wire::RequestHeader& h) {
  if (h.known_below_id() == 0) return SettledNumbers{h.first_unfinished_id(), {}};
  return SettledNumbers{h.known_below_id(), {h.unfinished_ids().begin(), h.unfinished_ids().end()}};
}

}  // namespace

void VariableService::Watch(std::unique_ptr<ServerMetrics> metrics, Tracer* tracer, int track) {
  metrics_ = std::move(metrics);
  tracer_ = tracer;
  track_ = track;
}

void VariableService::Handle(const Request& request, Response* response) {
  if (metrics_ == nullptr && tracer_ == nullptr) return HandleUnwatched(request, response);
  const bool waits = MayWait(request);
  if (metrics_ != nullptr && waits) metrics_->Waiting(+1);
  const absl::Time start = absl::Now();
  const int64_t start_us = tracer_ != nullptr ? tracer_->NowMicros() : 0;
  HandleUnwatched(request, response);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const std::string op = OpName(request.header);
  if (tracer_ != nullptr) tracer_->Span(track_, op, start_us, tracer_->NowMicros() - start_us);
  if (metrics_ != nullptr) {
    if (waits) metrics_->Waiting(-1);
    const auto bytes_in = static_cast<int64_t>(request.header.ByteSizeLong() + TensorBytes(request.tensors));
    const auto bytes_out = static_cast<int64_t>(response->header.ByteSizeLong() + TensorBytes(response->tensors));
    metrics_->Served(op, response->header.status_code(), bytes_in, bytes_out, seconds);
  }
}

void VariableService::HandleUnwatched(const Request& request, Response* response) {
  // Requests run on the transport's threads, which start with libtorch's
  // default thread count; optimizer math takes the task's own.
  UseComputeThreadsInThisThread();
  response->header.Clear();
  response->tensors.clear();
  const wire::RequestHeader& h = request.header;
  const bool recorded = h.request_id() != 0 && Changes(request);
  if (recorded) {
    auto begun = ledger_.Begin(h.client_id(), h.request_id(), SettledNumbersOf(h));
    if (!begun.ok()) return Conclude(begun.status(), response);
    if (begun->has_value()) {  // a repeat: the answer the original got
      response->header = **std::move(begun);
      ReadAfterApply(request, response, /*repeat=*/true);
      return;
    }
  }
  Conclude(DispatchGuarded(request, response), response);
  if (recorded) ledger_.Finish(h.client_id(), h.request_id(), response->header);
  ReadAfterApply(request, response, /*repeat=*/false);
}

void VariableService::ReadAfterApply(const Request& request, Response* response, bool repeat) {
  const wire::RequestHeader& h = request.header;
  if (response->header.status_code() != 0 || !h.has_apply_gradients()) return;
  const wire::ApplyGradientsRequest& apply = h.apply_gradients();
  // An elastic update answered with the values before it; a repeat reads
  // them as they are now.
  const bool elastic = apply.rule() == wire::UPDATE_ELASTIC;
  if (elastic ? !repeat : !apply.read_after()) return;
  // The same variables as the gradients, so no larger than the request.
  std::vector<int64_t> versions;
  absl::Status read = store_.Read(Names(apply.names()), &response->tensors, &versions);
  if (!read.ok()) Conclude(read, response);
}

void VariableService::Conclude(const absl::Status& status, Response* response) const {
  if (!status.ok()) {
    response->header.Clear();
    response->tensors.clear();
  }
  response->header.set_status_code(static_cast<int>(status.code()));
  response->header.set_status_message(std::string(status.message()));
  response->header.set_incarnation(incarnation_);
}

void VariableService::AdvertiseFastEndpoint(const std::string& kind, int port) {
  absl::MutexLock lock(&endpoint_mu_);
  fast_kind_ = kind;
  fast_port_ = port;
}

uint64_t VariableService::DrawIncarnation() {
  std::random_device device;
  uint64_t value = 0;
  while (value == 0) value = (uint64_t{device()} << 32) ^ device() ^ static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  return value;
}

absl::StatusOr<EmbeddingTable*> VariableService::TableFor(absl::string_view op, const std::string& name,
                                                          const Request& request, size_t tensors,
                                                          absl::string_view which) {
  SHOAL_ASSIGN_OR_RETURN(EmbeddingTable * table, tables_.Find(name));
  if (request.tensors.size() != tensors) {
    return absl::InvalidArgumentError(absl::StrCat(op, " of table '", name, "' on ", options_.task_name, " carries ",
                                                   request.tensors.size(), " tensors, not ", tensors, " (", which,
                                                   ")"));
  }
  return table;
}

absl::Status VariableService::DispatchGuarded(const Request& request, Response* response) {
  // Every request is validated before it is served, so nothing here should
  // throw; if something does (libtorch throws on misuse), that request
  // fails, not the whole ps task with every client's variables.
  try {
    return Dispatch(request, response);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(options_.task_name, " ran out of memory serving a ", OpName(request.header), " request"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(options_.task_name, " failed serving a ", OpName(request.header),
                                            " request (a bug in shoal; please report it): ", e.what()));
  }
}

absl::Status VariableService::Dispatch(const Request& request, Response* response) {
  const size_t bytes = TensorBytes(request.tensors);
  if (bytes > options_.max_message_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("request of ", bytes, " tensor bytes to ", options_.task_name,
                                                     " exceeds the limit of ", options_.max_message_bytes));
  }
  const wire::RequestHeader& h = request.header;
  SHOAL_RETURN_IF_ERROR(CheckListLengths(h, options_.task_name));
  switch (h.op_case()) {
    case wire::RequestHeader::kCreateVariables: {
      std::vector<wire::VariableDef> defs(h.create_variables().variables().begin(),
                                          h.create_variables().variables().end());
      SHOAL_ASSIGN_OR_RETURN(std::vector<bool> created,
                             store_.Create(defs, request.tensors, [this](int64_t new_bytes) {
                               return tables_.CheckRoomForVariables(static_cast<double>(store_.bytes()),
                                                                    static_cast<double>(new_bytes));
                             }));
      tables_.VariablesHold(static_cast<double>(store_.bytes()));
      auto* out = response->header.mutable_create_variables();
      for (bool c : created) out->add_created(c);
      return absl::OkStatus();
    }
    case wire::RequestHeader::kRead: {
      const std::vector<std::string> names = Names(h.read().names());
      auto* out = response->header.mutable_read();
      if (h.read().min_step() > 0) {
        std::vector<int64_t> steps;
        std::vector<std::string> contributors;
        SHOAL_ASSIGN_OR_RETURN(
            bool reached, store_.WaitForStep(names, h.read().min_step(),
                                             absl::Milliseconds(std::clamp<int64_t>(h.read().wait_ms(), 0, kMaxWaitMs)),
                                             &steps, &contributors));
        CopyInts(steps, out->mutable_steps());
        if (!reached) {
          out->set_pending(true);
          for (const auto& w : contributors) out->add_contributors(w);
          return absl::OkStatus();
        }
      }
      std::vector<int64_t> versions;
      SHOAL_RETURN_IF_ERROR(store_.Read(names, &response->tensors, &versions));
      CopyInts(versions, out->mutable_versions());
      return absl::OkStatus();
    }
    case wire::RequestHeader::kAssign: {
      std::vector<int64_t> versions;
      SHOAL_RETURN_IF_ERROR(store_.Assign(Names(h.assign().names()), request.tensors, &versions));
      if (h.assign().reset_accumulators()) {
        SHOAL_RETURN_IF_ERROR(store_.ResetAccumulators(Names(h.assign().names()), h.assign().accumulator_step()));
      }
      CopyInts(versions, response->header.mutable_assign()->mutable_versions());
      return absl::OkStatus();
    }
    case wire::RequestHeader::kApplyGradients: {
      std::vector<int64_t> versions;
      const auto& apply = h.apply_gradients();
      if (!wire::UpdateRule_IsValid(apply.rule())) {
        return absl::InvalidArgumentError(absl::StrCat("unknown update rule ", apply.rule(), " sent to ", options_.task_name));
      }
      SHOAL_RETURN_IF_ERROR(CheckCounterNames(apply.counters(), h, options_.task_name));
      auto* out = response->header.mutable_apply_gradients();
      // Leased data: the update and its places are applied in one step, or
      // neither (places applied already, or a lease lost).
      std::optional<DataLeases::Admission> admission;
      if (apply.has_progress()) {
        SHOAL_ASSIGN_OR_RETURN(admission, leases_.Admit(apply.progress(), absl::Now()));
      }
      const bool applies = !admission.has_value() || admission->apply();
      if (applies) {
        SHOAL_RETURN_IF_ERROR(store_.ApplyGradients(Names(apply.names()), request.tensors, &versions, apply.rule(),
                                                    apply.elastic_alpha(), &response->tensors));
      } else if (apply.rule() == wire::UPDATE_ELASTIC) {
        // A move not taken still answers with the centre, unmoved: the
        // worker starts its copy again from it.
        SHOAL_RETURN_IF_ERROR(store_.Read(Names(apply.names()), &response->tensors, &versions));
      }
      CopyInts(versions, out->mutable_versions());
      for (const auto& counter : apply.counters()) {
        out->add_counter_values(store_.AddToCounter(counter.name(), applies ? counter.delta() : 0));
      }
      if (admission.has_value()) {
        admission->Commit();
        *out->mutable_progress() = admission->answer();
      }
      return absl::OkStatus();
    }
    case wire::RequestHeader::kCounter: {
      const auto& counter = h.counter().counter();
      if (counter.name().empty()) {
        return absl::InvalidArgumentError(absl::StrCat("counter request to ", options_.task_name, " has no name"));
      }
      int64_t value = h.counter().assign() ? store_.SetCounter(counter.name(), counter.delta())
                                           : store_.AddToCounter(counter.name(), counter.delta());
      if (h.counter().wait_ms() > 0 && value < h.counter().wait_until_at_least()) {
        value = store_.WaitForCounter(counter.name(), h.counter().wait_until_at_least(),
                                      absl::Milliseconds(std::min<int64_t>(h.counter().wait_ms(), kMaxWaitMs)));
      }
      response->header.mutable_counter()->set_value(value);
      return absl::OkStatus();
    }
    case wire::RequestHeader::kSaveShard: {
      const auto& save = h.save_shard();
      SHOAL_RETURN_IF_ERROR(NeedsCheckpointDir(options_, "writes no checkpoints"));
      if (save.step() < 0 || save.shard() < 0 || save.shard() >= kMaxTensorsPerMessage) {
        return absl::InvalidArgumentError(absl::StrCat("save_shard request to ", options_.task_name, ": step ",
                                                       save.step(), ", shard ", save.shard(), " out of range"));
      }
      // The path is built here from two numbers: nothing from the wire names a file.
      const std::filesystem::path folder = CheckpointFolder(options_.checkpoint_dir, save.step());
      std::error_code error;
      std::filesystem::create_directories(folder, error);
      if (error) {
        return absl::InternalError(absl::StrCat(options_.task_name, " cannot create checkpoint folder '",
                                                folder.string(), "': ", error.message()));
      }
      // Leased data: the variables and their watermarks are taken together,
      // with no update admitted in between.
      wire::TaskMarks* marks = response->header.mutable_save_shard()->mutable_marks();
      std::vector<SavedVariable> saved;
      {
        const DataLeases::Frozen frozen(leases_);
        saved = store_.Snapshot();
        bool exact = false;
        for (auto& mark : frozen.Marks(save.marks_from_epoch(), &exact)) *marks->add_variables() = std::move(mark);
        marks->set_exact(exact);
        if (!save.step_counter().empty()) marks->set_step(store_.AddToCounter(save.step_counter(), 0));
      }
      const std::string path = std::filesystem::absolute(folder / ShardFileName(save.shard())).string();
      SHOAL_RETURN_IF_ERROR(Annotate(WriteShard(path, saved), options_.task_name));
      SHOAL_ASSIGN_OR_RETURN(const bool wrote_tables,
                             SaveTablesWithMarks((folder / TableFileName(save.shard())).string(),
                                                 save.marks_from_epoch(), marks));
      response->header.mutable_save_shard()->set_wrote_tables(wrote_tables);
      response->header.mutable_save_shard()->set_path(path);
      for (const auto& v : saved) response->header.mutable_save_shard()->add_names(v.name);
      return absl::OkStatus();
    }
    case wire::RequestHeader::kAccumulate: {
      const auto& accumulate = h.accumulate();
      if (accumulate.apply_at() < 0) {
        return absl::InvalidArgumentError(absl::StrCat("accumulate on ", options_.task_name, ": apply_at is ",
                                                       accumulate.apply_at(), ", must not be negative"));
      }
      SHOAL_RETURN_IF_ERROR(CheckCounterNames(accumulate.counters(), h, options_.task_name));
      std::optional<DataLeases::Admission> admission;
      if (accumulate.has_progress()) {
        SHOAL_ASSIGN_OR_RETURN(admission, leases_.Admit(accumulate.progress(), absl::Now()));
      }
      auto* out = response->header.mutable_accumulate();
      if (admission.has_value() && admission->answer().lease_lost()) {
        // Not taken: the sender does not hold the lease.
        for (int i = 0; i < accumulate.names_size(); ++i) out->add_accepted(false);
        *out->mutable_progress() = admission->answer();
        return absl::OkStatus();
      }
      // Places this task applied already (from the update of a worker that
      // held the shard before), or ahead of it: the sender still counts
      // toward the step, as on the tasks that take its tensors, so that no
      // task waits for it; its tensors add nothing here.
      const bool count_only = admission.has_value() && !admission->apply();
      std::vector<bool> accepted;
      SHOAL_RETURN_IF_ERROR(store_.Accumulate(Names(accumulate.names()), request.tensors, accumulate.local_step(),
                                              accumulate.worker(), &accepted, accumulate.apply_at(), count_only));
      for (bool a : accepted) out->add_accepted(a);
      for (const auto& counter : accumulate.counters()) store_.AddToCounter(counter.name(), counter.delta());
      if (admission.has_value()) {
        // A stale gradient was dropped: its places stay unapplied here, for
        // the worker to train again.
        const bool taken = std::all_of(accepted.begin(), accepted.end(), [](bool a) { return a; });
        if (taken && admission->apply()) admission->CommitAccumulated();
        *out->mutable_progress() = admission->answer();
      }
      return absl::OkStatus();
    }
    case wire::RequestHeader::kApplyAccumulated: {
      const auto& apply = h.apply_accumulated();
      if (!wire::AccumulatedRule_IsValid(apply.rule())) {
        return absl::InvalidArgumentError(absl::StrCat("unknown accumulated rule ", apply.rule(), " sent to ", options_.task_name));
      }
      SHOAL_ASSIGN_OR_RETURN(
          auto result, store_.ApplyAccumulated(Names(apply.names()), apply.replicas_to_aggregate(), apply.new_step(),
                                               absl::Milliseconds(std::clamp<int64_t>(apply.wait_ms(), 0, kMaxWaitMs)),
                                               apply.rule()));
      auto* out = response->header.mutable_apply_accumulated();
      out->set_applied(result.applied);
      for (int c : result.counts) out->add_counts(c);
      for (const auto& w : result.contributors) out->add_contributors(w);
      return absl::OkStatus();
    }
    case wire::RequestHeader::kSetOptimizer: {
      response->header.mutable_set_optimizer();
      return store_.SetOptimizer(Names(h.set_optimizer().names()), h.set_optimizer().optimizer());
    }
    case wire::RequestHeader::kReadSlots: {
      std::vector<OptimizerSlots> slots;
      SHOAL_RETURN_IF_ERROR(store_.ReadSlots(Names(h.read_slots().names()), &slots));
      auto* out = response->header.mutable_read_slots();
      for (auto& s : slots) {
        out->add_counts(static_cast<int>(s.tensors.size()));
        out->add_steps(s.step);
        for (auto& t : s.tensors) response->tensors.push_back(std::move(t));
      }
      return absl::OkStatus();
    }
    case wire::RequestHeader::kAssignSlots: {
      const auto& assign = h.assign_slots();
      if (assign.counts_size() != assign.names_size() || assign.steps_size() != assign.names_size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("assign_slots to ", options_.task_name, ": names, counts and steps differ in length"));
      }
      std::vector<OptimizerSlots> slots(assign.names_size());
      size_t next = 0;
      for (int i = 0; i < assign.names_size(); ++i) {
        if (assign.counts(i) < 0 || next + assign.counts(i) > request.tensors.size()) {
          return absl::InvalidArgumentError(absl::StrCat("assign_slots to ", options_.task_name,
                                                         ": the slot counts do not match the tensors sent"));
        }
        for (int k = 0; k < assign.counts(i); ++k) slots[i].tensors.push_back(request.tensors[next++]);
        slots[i].step = assign.steps(i);
      }
      if (next != request.tensors.size()) {
        return absl::InvalidArgumentError(absl::StrCat("assign_slots to ", options_.task_name, ": ",
                                                       request.tensors.size() - next, " tensors left over"));
      }
      response->header.mutable_assign_slots();
      return store_.AssignSlots(Names(assign.names()), slots);
    }
    case wire::RequestHeader::kLookup: {
      auto* out = response->header.mutable_lookup();
      for (const auto& info : store_.Lookup(Names(h.lookup().names()))) {
        out->add_present(info.present);
        *out->add_definitions() = info.def;
        out->add_versions(info.version);
      }
      return absl::OkStatus();
    }
    case wire::RequestHeader::kShutdown:
      if (!request.peer.empty() && options_.is_job_peer && !options_.is_job_peer(request.peer)) {
        return absl::PermissionDeniedError(absl::StrCat(options_.task_name, " refused a shutdown from ", request.peer,
                                                        ", which is not a host of this job's tasks"));
      }
      response->header.mutable_shutdown();
      std::call_once(shutdown_once_, [this] { shutdown_requested_.Notify(); });
      return absl::OkStatus();
    case wire::RequestHeader::kEndpoints: {
      absl::MutexLock lock(&endpoint_mu_);
      response->header.mutable_endpoints()->set_fast_kind(fast_kind_);
      response->header.mutable_endpoints()->set_fast_port(fast_port_);
      return absl::OkStatus();
    }
    case wire::RequestHeader::kCreateTables: {
      std::vector<wire::TableDef> defs(h.create_tables().tables().begin(), h.create_tables().tables().end());
      SHOAL_ASSIGN_OR_RETURN(std::vector<bool> created, tables_.Create(defs, static_cast<double>(store_.bytes())));
      for (bool c : created) response->header.mutable_create_tables()->add_created(c);
      return absl::OkStatus();
    }
    case wire::RequestHeader::kPullRows: {
      SHOAL_ASSIGN_OR_RETURN(EmbeddingTable * table,
                             TableFor("pull_rows", h.pull_rows().table(), request, 1, "the ids"));
      // The answer is ids x dim floats: refuse, before allocating it, one
      // that could not travel (a few ids of a wide table ask for much).
      const int64_t answer_bytes = request.tensors[0].numel() * table->def().dim() * 4;
      if (answer_bytes > static_cast<int64_t>(options_.max_message_bytes)) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "pull_rows of ", request.tensors[0].numel(), " rows of table '", h.pull_rows().table(), "' from ",
            options_.task_name, " would answer ", answer_bytes, " bytes, over the limit of ",
            options_.max_message_bytes));
      }
      SHOAL_ASSIGN_OR_RETURN(torch::Tensor rows, table->Pull(request.tensors[0]));
      const EmbeddingTable::Occupancy occupancy = table->occupancy();
      wire::PullRowsResponse* answer = response->header.mutable_pull_rows();
      answer->set_rows_held(occupancy.rows_held);
      answer->set_ids_refused(occupancy.ids_refused);
      answer->set_rows_evicted(occupancy.rows_evicted);
      response->tensors.push_back(std::move(rows));
      return absl::OkStatus();
    }
    case wire::RequestHeader::kPushRows: {
      const auto& push = h.push_rows();
      SHOAL_ASSIGN_OR_RETURN(EmbeddingTable * table,
                             TableFor("push_rows", push.table(), request, 2, "ids and gradients"));
      // Leased data: the rows and their places are applied in one step, or
      // neither (places applied already, or not reached yet).
      std::optional<DataLeases::Admission> admission;
      if (push.has_progress()) {
        SHOAL_ASSIGN_OR_RETURN(DataLeases * rows, RowLeases(push.table()));
        SHOAL_ASSIGN_OR_RETURN(admission, rows->Admit(push.progress(), absl::Now()));
      }
      int64_t pushes = 0;
      // (On leased data a push of no rows still moves this shard's watermark.)
      const bool has_rows = !admission.has_value() || request.tensors[0].numel() > 0;
      if (has_rows && (!admission.has_value() || admission->apply())) {
        SHOAL_ASSIGN_OR_RETURN(pushes, table->Push(request.tensors[0], request.tensors[1]));
      }
      response->header.mutable_push_rows()->set_pushes(pushes);
      if (admission.has_value()) {
        admission->Commit();
        *response->header.mutable_push_rows()->mutable_progress() = admission->answer();
      }
      return absl::OkStatus();
    }
    case wire::RequestHeader::kRestoreTables: {
      const auto& restore = h.restore_tables();
      SHOAL_RETURN_IF_ERROR(NeedsCheckpointDir(options_, "restores no tables"));
      std::set<int> shards;
      for (int shard : restore.shards()) {
        if (restore.step() < 0 || shard < 0 || shard >= kMaxTensorsPerMessage || !shards.insert(shard).second) {
          return absl::InvalidArgumentError(absl::StrCat("restore_tables request to ", options_.task_name, ": step ",
                                                         restore.step(), ", shard ", shard,
                                                         " out of range or named twice"));
        }
      }
      // Built here from numbers only, as for save_shard.
      const std::filesystem::path folder = CheckpointFolder(options_.checkpoint_dir, restore.step());
      std::vector<std::string> files;
      for (int shard : shards) files.push_back((folder / TableFileName(shard)).string());
      SHOAL_ASSIGN_OR_RETURN(const int64_t rows, RestoreTables(tables_, files));
      response->header.mutable_restore_tables()->set_rows(rows);
      return absl::OkStatus();
    }
    case wire::RequestHeader::kLease: {
      SHOAL_ASSIGN_OR_RETURN(*response->header.mutable_lease(), leases_.Lease(h.lease(), absl::Now()));
      // Counters carry the takeovers to whoever reports them.
      const DataLeases::Takeovers takeovers = leases_.takeovers();
      store_.SetCounter(kLeaseTakeoversCounter, takeovers.count);
      store_.SetCounter(kLeaseTakeoverMsCounter, absl::ToInt64Milliseconds(takeovers.total));
      store_.SetCounter(kLeaseLongestTakeoverMsCounter, absl::ToInt64Milliseconds(takeovers.longest));
      return absl::OkStatus();
    }
    case wire::RequestHeader::kLeaseTable: {
      if (h.lease_table().restore()) {
        const auto& restore = h.lease_table();
        const bool marked = restore.has_marks();
        const std::vector<wire::ShardMark> variable_marks(restore.marks().variables().begin(),
                                                          restore.marks().variables().end());
        SHOAL_RETURN_IF_ERROR(leases_.Restore(restore.state(), restore.hands_out_leases(),
                                              marked && restore.marks().exact() ? &variable_marks : nullptr));
        SHOAL_RETURN_IF_ERROR(RestoreRowLeases(restore.state(), marked ? &restore.marks() : nullptr));
      }
      *response->header.mutable_lease_table()->mutable_state() = leases_.Snapshot();
      return absl::OkStatus();
    }
    case wire::RequestHeader::kLedger: {
      *response->header.mutable_ledger() = leases_.Ledger();
      AddTableLedgers(response->header.mutable_ledger());
      return absl::OkStatus();
    }
    case wire::RequestHeader::OP_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("request to ", options_.task_name, " names no operation"));
}

namespace {

// A table's marks in a restore's marks: none to go by (nullopt) when the
// restore had no marks; an empty list when the table had none saved (no
// push with places had reached it).
std::optional<std::vector<wire::ShardMark>> TableMarks(const std::optional<wire::TaskMarks>& marks,
                                                       const std::string& table) {
  if (!marks.has_value()) return std::nullopt;
  std::vector<wire::ShardMark> found;
  for (const wire::TableMarks& saved : marks->tables()) {
    if (saved.table() == table) found.assign(saved.marks().begin(), saved.marks().end());
  }
  return found;
}

}  // namespace

absl::StatusOr<DataLeases*> VariableService::RowLeases(const std::string& table) {
  absl::MutexLock lock(&row_leases_mu_);
  std::unique_ptr<DataLeases>& rows = row_leases_[table];  // the table exists (TableFor)
  if (rows == nullptr) {
    auto made = std::make_unique<DataLeases>(absl::StrCat(options_.task_name, " table '", table, "'"));
    if (restored_leases_.has_value()) {
      const std::optional<std::vector<wire::ShardMark>> marks = TableMarks(restored_marks_, table);
      SHOAL_RETURN_IF_ERROR(made->Restore(*restored_leases_, false, marks ? &*marks : nullptr));
    }
    rows = std::move(made);
  }
  return rows.get();
}

absl::Status VariableService::RestoreRowLeases(const wire::LeaseTableState& state, const wire::TaskMarks* marks) {
  absl::MutexLock lock(&row_leases_mu_);
  restored_leases_ = state;
  restored_marks_ = marks != nullptr ? std::optional<wire::TaskMarks>(*marks) : std::nullopt;
  for (auto& [table, rows] : row_leases_) {
    const std::optional<std::vector<wire::ShardMark>> table_marks = TableMarks(restored_marks_, table);
    SHOAL_RETURN_IF_ERROR(rows->Restore(state, false, table_marks ? &*table_marks : nullptr));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> VariableService::SaveTablesWithMarks(const std::string& path, int64_t from_epoch,
                                                          wire::TaskMarks* marks) {
  // No table's rows take a push with places while the file is written (nor
  // does a table start keeping its own watermarks): the rows saved are
  // those below the marks.
  absl::MutexLock lock(&row_leases_mu_);
  std::vector<std::unique_ptr<DataLeases::Frozen>> frozen;
  for (auto& [table, rows] : row_leases_) frozen.push_back(std::make_unique<DataLeases::Frozen>(*rows));
  SHOAL_ASSIGN_OR_RETURN(const bool wrote_tables, SaveTables(tables_, path));
  size_t i = 0;
  for (const auto& [table, rows] : row_leases_) {
    wire::TableMarks* table_marks = marks->add_tables();
    table_marks->set_table(table);
    bool exact = false;  // always true here: rows are applied as they are pushed
    for (auto& mark : frozen[i++]->Marks(from_epoch, &exact)) *table_marks->add_marks() = std::move(mark);
  }
  return wrote_tables;
}

void VariableService::AddTableLedgers(wire::LedgerResponse* ledger) {
  absl::MutexLock lock(&row_leases_mu_);
  for (const EmbeddingTable* table : tables_.All()) {
    wire::TableLedger* held = ledger->add_tables();
    held->set_table(table->def().name());
    auto rows = row_leases_.find(table->def().name());
    if (rows != row_leases_.end()) *held->mutable_epochs() = rows->second->Ledger().epochs();
  }
}

}  // namespace shoal
