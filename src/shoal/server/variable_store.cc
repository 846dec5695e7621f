#include "shoal/server/variable_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shoal/core/dtype.h"
#include "shoal/core/status.h"

namespace shoal {
namespace {

std::string ShapeString(c10::IntArrayRef shape) { return absl::StrCat("[", absl::StrJoin(shape, ","), "]"); }

}  // namespace

namespace {

// Every gradient passes this twice (the worker's NaN guard, the server's
// check), so it runs at the machine's vector width: AVX2 where the CPU has it
// (measured 15 us for the default MLP's 235,000 floats against 36 us with
// SSE2), chosen once at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
bool AllFiniteFloats(const float* p, int64_t n) {
  // Inf and NaN are exactly the magnitudes at or above Inf's bit pattern;
  // an unsigned max-reduction vectorises.
  uint32_t largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, sizeof(bits));
    bits &= 0x7fffffffu;
    largest = bits > largest ? bits : largest;
  }
  return largest < 0x7f800000u;
}

}  // namespace

bool AllFinite(const torch::Tensor& t) {
  if (!t.is_floating_point()) return true;
  torch::Tensor c = t.contiguous();
  return AllFiniteFloats(c.data_ptr<float>(), c.numel());
}

namespace {

int64_t SlotBytes(const OptimizerSlots& slots) {
  int64_t bytes = 0;
  for (const torch::Tensor& slot : slots.tensors) bytes += slot.defined() ? slot.nbytes() : 0;
  return bytes;
}

}  // namespace

absl::StatusOr<std::vector<bool>> VariableStore::Create(
    const std::vector<wire::VariableDef>& defs, const std::vector<torch::Tensor>& initial_values,
    const std::function<absl::Status(int64_t new_bytes)>& check_room) {
  if (defs.size() != initial_values.size()) {
    return absl::InvalidArgumentError(absl::StrCat("create on ", task_name_, ": ", defs.size(),
                                                   " variables but ", initial_values.size(), " initial values"));
  }
  // Validate everything first: nothing is created unless all can be.
  std::vector<std::shared_ptr<Variable>> fresh(defs.size());
  std::map<std::string, size_t> names_in_request;
  for (size_t i = 0; i < defs.size(); ++i) {
    const wire::VariableDef& def = defs[i];
    const std::string where = absl::StrCat("variable '", def.name(), "' on ", task_name_);
    if (def.name().empty()) return absl::InvalidArgumentError(absl::StrCat("create on ", task_name_, ": empty variable name"));
    if (!names_in_request.emplace(def.name(), i).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": created twice in one request"));
    }
    std::vector<int64_t> shape(def.shape().begin(), def.shape().end());
    for (int64_t d : shape) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": negative dimension in ", ShapeString(shape)));
    }
    const std::optional<torch::ScalarType> dtype = TorchDType(def.dtype());
    if (!dtype) return absl::InvalidArgumentError(absl::StrCat(where, ": unknown dtype number ", def.dtype()));
    if (*dtype != torch::kFloat32 && !def.buffer()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": a trained variable must be float32, not ",
                                                     DTypeName(*dtype), " (only buffers may be int64)"));
    }
    const torch::Tensor& init = initial_values[i];
    if (!init.defined() || init.scalar_type() != *dtype) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": initial value must be ", DTypeName(*dtype),
                                                     init.defined() ? absl::StrCat(", not ", DTypeName(init.scalar_type())) : ""));
    }
    if (init.sizes() != c10::IntArrayRef(shape)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": initial value has shape ", ShapeString(init.sizes()),
                                                     ", the definition says ", ShapeString(shape)));
    }
    if (!AllFinite(init)) return absl::InvalidArgumentError(absl::StrCat(where, ": initial value is not finite"));
    auto var = std::make_shared<Variable>();
    var->def = def;
    var->def.set_dtype(*WireDType(*dtype));
    if (def.buffer()) {
      var->def.clear_optimizer();  // a buffer is never trained
    } else {
      auto optimizer = Optimizer::Create(def.optimizer());
      if (!optimizer.ok()) return Annotate(optimizer.status(), where);
      *var->def.mutable_optimizer() = (*optimizer)->config();
      var->optimizer = *std::move(optimizer);
    }
    fresh[i] = std::move(var);
  }
  std::vector<bool> created(defs.size(), false);
  std::unique_lock lock(map_mu_);
  for (size_t i = 0; i < defs.size(); ++i) {
    auto it = variables_.find(defs[i].name());
    if (it == variables_.end()) continue;
    const wire::VariableDef& existing = it->second->def;
    bool same = existing.shape().size() == defs[i].shape().size() &&
                std::equal(existing.shape().begin(), existing.shape().end(), defs[i].shape().begin()) &&
                existing.optimizer().kind() == fresh[i]->def.optimizer().kind() &&
                existing.use_locking() == defs[i].use_locking() && existing.buffer() == defs[i].buffer() &&
                existing.dtype() == fresh[i]->def.dtype();
    if (!same) {
      return absl::AlreadyExistsError(absl::StrCat(
          "variable '", defs[i].name(), "' on ", task_name_, " already exists as ",
          existing.buffer() ? "a buffer" : "a variable", " of shape ",
          ShapeString(std::vector<int64_t>(existing.shape().begin(), existing.shape().end())), ", dtype ",
          wire::DType_Name(existing.dtype()), " and optimizer '", existing.optimizer().kind(),
          "'; a different definition was requested"));
    }
  }
  if (check_room) {
    // What the new variables will hold: each value, and as many slots of its
    // shape as its optimizer keeps (asked of a one-element stand-in).
    int64_t new_bytes = 0;
    for (size_t i = 0; i < defs.size(); ++i) {
      if (variables_.count(defs[i].name())) continue;
      const size_t slots =
          fresh[i]->optimizer ? fresh[i]->optimizer->MakeSlots(torch::zeros({1})).tensors.size() : 0;
      new_bytes += initial_values[i].nbytes() * static_cast<int64_t>(1 + slots);
    }
    SHOAL_RETURN_IF_ERROR(check_room(new_bytes));
  }
  for (size_t i = 0; i < defs.size(); ++i) {
    if (variables_.count(defs[i].name())) continue;
    Variable& var = *fresh[i];
    var.value = initial_values[i].clone(at::MemoryFormat::Contiguous);
    if (var.optimizer) var.slots = var.optimizer->MakeSlots(var.value);
    bytes_ += var.value.nbytes() + SlotBytes(var.slots);
    variables_.emplace(defs[i].name(), std::move(fresh[i]));
    created[i] = true;
  }
  return created;
}

bool VariableStore::Exclusive(const Variable& var) {
  // An optimizer with slots (momentum, Adagrad, Adam, RMSProp) updates them
  // and the value in separate whole-tensor passes; two unlocked applies then
  // pair one's first moment with the other's second, and where the second
  // moment is still near zero the step explodes (measured: async accuracy
  // falling to 15-50% on a loaded machine). Only slot-free SGD runs Hogwild.
  return var.def.use_locking() || !var.slots.tensors.empty();
}

absl::Status VariableStore::Find(const std::vector<std::string>& names,
                                 std::vector<std::shared_ptr<Variable>>* found) const {
  found->clear();
  found->reserve(names.size());
  std::shared_lock lock(map_mu_);
  for (const std::string& name : names) {
    auto it = variables_.find(name);
    if (it == variables_.end()) {
      return absl::NotFoundError(absl::StrCat("variable '", name, "' not found on ", task_name_));
    }
    found->push_back(it->second);
  }
  return absl::OkStatus();
}

absl::Status VariableStore::RefuseBuffers(const std::vector<std::shared_ptr<Variable>>& vars,
                                          absl::string_view what) const {
  for (const auto& var : vars) {
    if (var->def.buffer()) {
      return absl::FailedPreconditionError(absl::StrCat(what, " for '", var->def.name(), "' on ", task_name_,
                                                        ": it is a buffer, which is assigned, not trained"));
    }
  }
  return absl::OkStatus();
}

absl::Status VariableStore::CheckTensors(const std::vector<std::shared_ptr<Variable>>& vars,
                                         const std::vector<torch::Tensor>& tensors, absl::string_view what,
                                         bool require_finite) const {
  if (vars.size() != tensors.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " on ", task_name_, ": ", vars.size(),
                                                   " names but ", tensors.size(), " tensors"));
  }
  for (size_t i = 0; i < vars.size(); ++i) {
    const torch::Tensor& t = tensors[i];
    const std::string& name = vars[i]->def.name();
    const torch::ScalarType dtype = vars[i]->value.scalar_type();
    if (!t.defined() || t.scalar_type() != dtype) {
      return absl::InvalidArgumentError(absl::StrCat(what, " for variable '", name, "' on ", task_name_,
                                                     ": dtype must be ", DTypeName(dtype),
                                                     t.defined() ? absl::StrCat(", not ", DTypeName(t.scalar_type())) : ""));
    }
    if (t.sizes() != vars[i]->value.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " for variable '", name, "' on ", task_name_,
                                                     ": shape ", ShapeString(t.sizes()), " does not match the variable's ",
                                                     ShapeString(vars[i]->value.sizes())));
    }
    if (require_finite && !AllFinite(t)) {
      return absl::InvalidArgumentError(absl::StrCat(what, " for variable '", name, "' on ", task_name_,
                                                     " contains NaN or Inf; nothing was applied"));
    }
  }
  return absl::OkStatus();
}

absl::Status VariableStore::Read(const std::vector<std::string>& names, std::vector<torch::Tensor>* values,
                                 std::vector<int64_t>* versions) const {
  std::vector<std::shared_ptr<Variable>> vars;
  SHOAL_RETURN_IF_ERROR(Find(names, &vars));
  values->clear();
  versions->clear();
  for (const auto& var : vars) {
    values->push_back(var->value);
    versions->push_back(var->version.load(std::memory_order_relaxed));
  }
  return absl::OkStatus();
}

absl::Status VariableStore::Update(const std::vector<std::string>& names, const std::vector<torch::Tensor>& tensors,
                                   absl::string_view what, std::vector<int64_t>* versions,
                                   const std::function<void(Variable&, const torch::Tensor&)>& update) {
  std::vector<std::shared_ptr<Variable>> vars;
  SHOAL_RETURN_IF_ERROR(Find(names, &vars));
  SHOAL_RETURN_IF_ERROR(CheckTensors(vars, tensors, what, /*require_finite=*/true));
  torch::NoGradGuard no_grad;
  versions->clear();
  for (size_t i = 0; i < vars.size(); ++i) {
    Variable& var = *vars[i];
    std::unique_lock<std::mutex> lock(var.update_mu, std::defer_lock);
    if (Exclusive(var)) lock.lock();
    update(var, tensors[i]);
    versions->push_back(var.version.fetch_add(1) + 1);
  }
  return absl::OkStatus();
}

absl::Status VariableStore::Assign(const std::vector<std::string>& names, const std::vector<torch::Tensor>& values,
                                   std::vector<int64_t>* versions) {
  return Update(names, values, "assign", versions,
                [](Variable& var, const torch::Tensor& value) { var.value.copy_(value); });
}

namespace {

// EASGD's move of the centre `value` towards a worker's `copy`, keeping the
// value before it in `before`: value += (copy - value) * alpha, in one pass
// over memory rather than libtorch's four (a copy, two temporaries, an add),
// since the ps does it for every exchange. Float operations in the order
// libtorch's `(copy - value) * alpha` takes them (alpha as a float), with no
// fused multiply-add (none is built for), so the worker's own half of the
// move, computed with libtorch, is the same float difference.
void MoveElastically(torch::Tensor& value, const torch::Tensor& copy, double alpha, torch::Tensor& before) {
  const torch::Tensor from = copy.contiguous();
  float* v = value.data_ptr<float>();
  float* b = before.data_ptr<float>();
  const float* x = from.data_ptr<float>();
  const float a = static_cast<float>(alpha);
  for (int64_t i = 0, n = value.numel(); i < n; ++i) {
    const float was = v[i];
    b[i] = was;
    const float d = (x[i] - was) * a;
    v[i] = was + d;
  }
}

}  // namespace

absl::Status VariableStore::ApplyGradients(const std::vector<std::string>& names,
                                           const std::vector<torch::Tensor>& gradients,
                                           std::vector<int64_t>* versions, wire::UpdateRule rule,
                                           double elastic_alpha, std::vector<torch::Tensor>* before) {
  if (rule == wire::UPDATE_ADD) {
    return Update(names, gradients, "delta", versions,
                  [](Variable& var, const torch::Tensor& delta) { var.value.add_(delta); });
  }
  {
    std::vector<std::shared_ptr<Variable>> vars;
    SHOAL_RETURN_IF_ERROR(Find(names, &vars));
    SHOAL_RETURN_IF_ERROR(RefuseBuffers(vars, rule == wire::UPDATE_ELASTIC ? "elastic copy" : "gradient"));
  }
  if (rule == wire::UPDATE_ELASTIC) {
    if (!(elastic_alpha > 0 && elastic_alpha <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("elastic alpha ", elastic_alpha, " sent to ", task_name_, " is not in (0, 1]"));
    }
    if (before == nullptr) return absl::InternalError("an elastic update needs somewhere to put the value before it");
    std::vector<torch::Tensor> was;
    SHOAL_RETURN_IF_ERROR(
        Update(names, gradients, "elastic copy", versions, [&](Variable& var, const torch::Tensor& copy) {
          was.push_back(torch::empty_like(var.value));
          MoveElastically(var.value, copy, elastic_alpha, was.back());
        }));
    *before = std::move(was);
    return absl::OkStatus();
  }
  return Update(names, gradients, "gradient", versions, [](Variable& var, const torch::Tensor& gradient) {
    std::atomic_load(&var.optimizer)->Apply(var.value, gradient, var.slots);
  });
}

int64_t VariableStore::AddToCounter(const std::string& name, int64_t delta) {
  std::lock_guard lock(counter_mu_);
  int64_t value = counters_[name] += delta;
  if (delta != 0) counter_changed_.notify_all();
  return value;
}

int64_t VariableStore::SetCounter(const std::string& name, int64_t value) {
  std::lock_guard lock(counter_mu_);
  counters_[name] = value;
  counter_changed_.notify_all();
  return value;
}

absl::Status VariableStore::ResetAccumulators(const std::vector<std::string>& names, int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("accumulator step ", step, " sent to ", task_name_, " is negative"));
  }
  std::vector<std::shared_ptr<Variable>> vars;
  SHOAL_RETURN_IF_ERROR(Find(names, &vars));
  {
    std::lock_guard lock(accumulate_mu_);
    for (const auto& var : vars) {
      if (var->gradient_sum.defined()) var->gradient_sum.zero_();
      var->accumulated = 0;
      var->contributors.clear();
      var->accumulator_step = step;
    }
  }
  accumulated_.notify_all();
  return absl::OkStatus();
}

int64_t VariableStore::WaitForCounter(const std::string& name, int64_t at_least, absl::Duration wait) {
  std::unique_lock lock(counter_mu_);
  counter_changed_.wait_for(lock, absl::ToChronoNanoseconds(wait), [&] { return counters_[name] >= at_least; });
  return counters_[name];
}

absl::Status VariableStore::Accumulate(const std::vector<std::string>& names,
                                       const std::vector<torch::Tensor>& gradients, int64_t local_step,
                                       const std::string& worker, std::vector<bool>* accepted, int apply_at,
                                       bool count_only) {
  if (worker.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("accumulate on ", task_name_, " names no worker"));
  }
  std::vector<std::shared_ptr<Variable>> vars;
  SHOAL_RETURN_IF_ERROR(Find(names, &vars));
  SHOAL_RETURN_IF_ERROR(RefuseBuffers(vars, "accumulate"));
  SHOAL_RETURN_IF_ERROR(CheckTensors(vars, gradients, "gradient", /*require_finite=*/true));
  torch::NoGradGuard no_grad;
  accepted->assign(vars.size(), false);
  {
    std::lock_guard lock(accumulate_mu_);
    for (size_t i = 0; i < vars.size(); ++i) {
      Variable& var = *vars[i];
      // Stale (older than the accumulator's step), or from a step the
      // accumulator has not reached: from a worker that has not yet seen a
      // restore take the job back. Either is dropped.
      if (local_step != var.accumulator_step) continue;
      // A step counts workers, not messages: a worker's second tensor for the
      // same step (sent again after a restart, say) is dropped.
      if (std::find(var.contributors.begin(), var.contributors.end(), worker) != var.contributors.end()) continue;
      if (!count_only) {
        if (!var.gradient_sum.defined()) var.gradient_sum = torch::zeros_like(var.value);
        var.gradient_sum.add_(gradients[i]);
        ++var.accumulated;
      }
      var.contributors.push_back(worker);
      (*accepted)[i] = true;
      if (apply_at > 0 && static_cast<int>(var.contributors.size()) >= apply_at) {
        ApplyAccumulator(var, wire::MEAN_GRADIENT, var.accumulator_step + 1);
      }
    }
  }
  accumulated_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<bool> VariableStore::WaitForStep(const std::vector<std::string>& names, int64_t min_step,
                                                absl::Duration wait, std::vector<int64_t>* steps,
                                                std::vector<std::string>* contributors) {
  std::vector<std::shared_ptr<Variable>> vars;
  SHOAL_RETURN_IF_ERROR(Find(names, &vars));
  auto reached = [&] {
    return std::all_of(vars.begin(), vars.end(), [&](const auto& v) { return v->accumulator_step >= min_step; });
  };
  std::unique_lock lock(accumulate_mu_);
  const bool ready = accumulated_.wait_for(lock, absl::ToChronoNanoseconds(wait), reached);
  steps->clear();
  for (const auto& v : vars) steps->push_back(v->accumulator_step);
  if (!vars.empty()) *contributors = vars[0]->contributors;
  return ready;
}

void VariableStore::ApplyAccumulator(Variable& var, wire::AccumulatedRule rule, int64_t new_step) {
  if (var.accumulated > 0) {
    std::unique_lock<std::mutex> update(var.update_mu, std::defer_lock);
    if (Exclusive(var)) update.lock();
    torch::NoGradGuard no_grad;
    torch::Tensor mean = var.gradient_sum.div(var.accumulated);
    switch (rule) {
      case wire::ASSIGN_MEAN:
        var.value.copy_(mean);
        break;
      case wire::BLOCK_MOMENTUM:
        std::atomic_load(&var.optimizer)->Apply(var.value, var.value - mean, var.slots);
        break;
      case wire::SUM_GRADIENT:
        std::atomic_load(&var.optimizer)->Apply(var.value, var.gradient_sum, var.slots);
        break;
      default:
        std::atomic_load(&var.optimizer)->Apply(var.value, mean, var.slots);
    }
    var.version.fetch_add(1);
  }
  if (var.gradient_sum.defined()) var.gradient_sum.zero_();
  var.accumulated = 0;
  var.contributors.clear();
  var.accumulator_step = new_step;
}

absl::StatusOr<VariableStore::ApplyAccumulatedResult> VariableStore::ApplyAccumulated(
    const std::vector<std::string>& names, int replicas_to_aggregate, int64_t new_step, absl::Duration wait,
    wire::AccumulatedRule rule) {
  if (replicas_to_aggregate < 1) {
    return absl::InvalidArgumentError(absl::StrCat("apply_accumulated on ", task_name_,
                                                   ": replicas_to_aggregate must be at least 1"));
  }
  std::vector<std::shared_ptr<Variable>> vars;
  SHOAL_RETURN_IF_ERROR(Find(names, &vars));
  SHOAL_RETURN_IF_ERROR(RefuseBuffers(vars, "apply_accumulated"));
  auto done = [&] {
    return std::all_of(vars.begin(), vars.end(), [&](const auto& v) { return v->accumulator_step >= new_step; });
  };
  auto ready = [&] {
    return std::all_of(vars.begin(), vars.end(), [&](const auto& v) {
      return v->accumulator_step >= new_step || static_cast<int>(v->contributors.size()) >= replicas_to_aggregate;
    });
  };
  ApplyAccumulatedResult result;
  std::unique_lock lock(accumulate_mu_);
  accumulated_.wait_for(lock, absl::ToChronoNanoseconds(wait), ready);
  if (!vars.empty()) result.contributors = vars[0]->contributors;
  if (!done() && !ready()) {
    for (const auto& v : vars) result.counts.push_back(static_cast<int>(v->contributors.size()));
    return result;
  }
  for (const auto& v : vars) {
    result.counts.push_back(static_cast<int>(v->contributors.size()));
    if (v->accumulator_step < new_step) ApplyAccumulator(*v, rule, new_step);  // else applied before
  }
  result.applied = true;
  return result;
}

absl::Status VariableStore::SetOptimizer(const std::vector<std::string>& names,
                                         const wire::OptimizerConfig& optimizer) {
  std::vector<std::shared_ptr<Variable>> vars;
  SHOAL_RETURN_IF_ERROR(Find(names, &vars));
  SHOAL_RETURN_IF_ERROR(RefuseBuffers(vars, "set_optimizer"));
  SHOAL_ASSIGN_OR_RETURN(auto rule, Optimizer::Create(optimizer));
  for (const auto& var : vars) {
    if (var->def.optimizer().kind() != rule->config().kind()) {
      return absl::InvalidArgumentError(absl::StrCat("set_optimizer for variable '", var->def.name(), "' on ",
                                                     task_name_, ": its optimizer is '", var->def.optimizer().kind(),
                                                     "', not '", rule->config().kind(), "'"));
    }
  }
  std::unique_lock definitions(map_mu_);  // Lookup and Create read the definitions under it
  for (const auto& var : vars) {
    {
      // Before the rule is published: an apply that finds the new rule finds
      // its slots (momentum turned on for a variable made without it).
      std::lock_guard lock(var->update_mu);
      const int64_t before = SlotBytes(var->slots);
      rule->AddMissingSlots(var->value, &var->slots);
      bytes_ += SlotBytes(var->slots) - before;
    }
    std::atomic_store(&var->optimizer, rule);  // applies in flight finish with the old one
    *var->def.mutable_optimizer() = rule->config();
  }
  return absl::OkStatus();
}

absl::Status VariableStore::ReadSlots(const std::vector<std::string>& names,
                                      std::vector<OptimizerSlots>* slots) const {
  std::vector<std::shared_ptr<Variable>> vars;
  SHOAL_RETURN_IF_ERROR(Find(names, &vars));
  slots->clear();
  for (const auto& var : vars) {
    std::lock_guard lock(var->update_mu);
    OptimizerSlots copy;
    for (const auto& t : var->slots.tensors) copy.tensors.push_back(t.clone());
    copy.step = var->slots.step;
    slots->push_back(std::move(copy));
  }
  return absl::OkStatus();
}

int64_t VariableStore::count() const {
  std::shared_lock lock(map_mu_);
  return static_cast<int64_t>(variables_.size());
}

std::vector<SavedVariable> VariableStore::Snapshot() const {
  std::vector<std::shared_ptr<Variable>> vars;
  {
    std::shared_lock lock(map_mu_);
    for (const auto& [name, var] : variables_) vars.push_back(var);
  }
  std::vector<SavedVariable> saved;
  for (const auto& var : vars) {
    std::lock_guard lock(var->update_mu);
    SavedVariable v{var->def.name(), var->def.optimizer().kind(), var->value.clone(), {}};
    for (const auto& t : var->slots.tensors) v.slots.tensors.push_back(t.clone());
    v.slots.step = var->slots.step;
    saved.push_back(std::move(v));
  }
  return saved;
}

absl::Status VariableStore::AssignSlots(const std::vector<std::string>& names,
                                        const std::vector<OptimizerSlots>& slots) {
  std::vector<std::shared_ptr<Variable>> vars;
  SHOAL_RETURN_IF_ERROR(Find(names, &vars));
  if (slots.size() != vars.size()) {
    return absl::InvalidArgumentError(absl::StrCat("assign_slots on ", task_name_, ": ", vars.size(), " names but ",
                                                   slots.size(), " slot sets"));
  }
  for (size_t i = 0; i < vars.size(); ++i) {
    const Variable& var = *vars[i];
    const std::string where = absl::StrCat("assign_slots for variable '", var.def.name(), "' on ", task_name_);
    if (slots[i].tensors.size() != var.slots.tensors.size()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", slots[i].tensors.size(), " slots, its optimizer '",
                                                     var.def.optimizer().kind(), "' keeps ",
                                                     var.slots.tensors.size()));
    }
    for (size_t k = 0; k < slots[i].tensors.size(); ++k) {
      const torch::Tensor& t = slots[i].tensors[k];
      if (!t.defined() || t.scalar_type() != torch::kFloat32 || t.sizes() != var.slots.tensors[k].sizes()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": slot ", k, " must be float32 of shape ",
                                                       ShapeString(var.slots.tensors[k].sizes())));
      }
      if (!AllFinite(t)) return absl::InvalidArgumentError(absl::StrCat(where, ": slot ", k, " is not finite"));
    }
    if (slots[i].step < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": negative step"));
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < vars.size(); ++i) {
    Variable& var = *vars[i];
    std::lock_guard lock(var.update_mu);
    for (size_t k = 0; k < slots[i].tensors.size(); ++k) var.slots.tensors[k].copy_(slots[i].tensors[k]);
    var.slots.step = slots[i].step;
    var.version.fetch_add(1);
  }
  return absl::OkStatus();
}

std::vector<VariableStore::VariableInfo> VariableStore::Lookup(const std::vector<std::string>& names) const {
  std::vector<VariableInfo> infos(names.size());
  std::shared_lock lock(map_mu_);
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = variables_.find(names[i]);
    if (it == variables_.end()) continue;
    infos[i].present = true;
    infos[i].def = it->second->def;
    infos[i].version = it->second->version.load();
  }
  return infos;
}

}  // namespace shoal
