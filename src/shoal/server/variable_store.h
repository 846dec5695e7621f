// VariableStore: the variables one task hosts, their optimizer slots, and
// named int64 counters (global_step and friends).
//
// A variable is float32 and trained by its optimizer, or a buffer
// (VariableDef.buffer: BatchNorm's running statistics), float32 or int64,
// which is read, assigned and added to but never given gradients.
//
// Every method validates its whole request (names, shapes, dtypes,
// finiteness) before it changes anything, and an error names the variable
// and this task; so a bad request leaves the store exactly as it was.
//
// Thread safety: all methods may be called concurrently. The name -> variable
// map has its own lock; values are read and updated in place without it.
// Reads never lock a variable (a reader may see an apply half done, as in
// TensorFlow's asynchronous mode). Applies and assigns to a variable created
// with use_locking, or trained by an optimizer that keeps slots, are mutually
// exclusive; plain SGD without use_locking races (Hogwild).
#ifndef SHOAL_SERVER_VARIABLE_STORE_H_
#define SHOAL_SERVER_VARIABLE_STORE_H_

#include <torch/types.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "shoal/server/checkpoint_shard.h"
#include "shoal/server/optimizer.h"
#include "shoal/wire.pb.h"

namespace shoal {

class VariableStore {
 public:
  // `task_name` (e.g. "/job:ps/task:0") goes into every error message.
  explicit VariableStore(std::string task_name) : task_name_(std::move(task_name)) {}
  VariableStore(const VariableStore&) = delete;
  VariableStore& operator=(const VariableStore&) = delete;

  // Creates each variable with its initial value (copied). A variable that
  // exists with the same shape and optimizer kind is left alone
  // (created=false): a restarted chief does not reset training, and
  // hyper-parameters changed since (SetOptimizer) stay. A different shape or
  // kind is AlreadyExists. All or nothing.
  // `check_room`, if given, is asked whether the new variables' values and
  // slots (`new_bytes`) fit, after every definition is checked and before
  // anything is allocated; its error is returned and nothing is created.
  absl::StatusOr<std::vector<bool>> Create(const std::vector<wire::VariableDef>& defs,
                                           const std::vector<torch::Tensor>& initial_values,
                                           const std::function<absl::Status(int64_t new_bytes)>& check_room = {});

  // Returns the live value tensors (aliases: read-only for the caller).
  absl::Status Read(const std::vector<std::string>& names, std::vector<torch::Tensor>* values,
                    std::vector<int64_t>* versions) const;

  // Copies `values` into the variables in place.
  absl::Status Assign(const std::vector<std::string>& names, const std::vector<torch::Tensor>& values,
                      std::vector<int64_t>* versions);

  // Applies each update by `rule`: a gradient through its variable's
  // optimizer, a delta added to the value, or (UPDATE_ELASTIC) a worker's
  // copy x that moves the value by elastic_alpha * (x - value), with the
  // value before it put in `before` (copies). Updates must match the
  // variable's shape and be finite.
  absl::Status ApplyGradients(const std::vector<std::string>& names,
                              const std::vector<torch::Tensor>& gradients,
                              std::vector<int64_t>* versions,
                              wire::UpdateRule rule = wire::UPDATE_OPTIMIZER, double elastic_alpha = 0,
                              std::vector<torch::Tensor>* before = nullptr);

  // Adds `delta` to counter `name` (created at 0) and returns the new value.
  int64_t AddToCounter(const std::string& name, int64_t delta);
  // Sets counter `name` to `value`; returns it.
  int64_t SetCounter(const std::string& name, int64_t value);
  // Empties the named variables' accumulators and moves them to `step`
  // (a restored checkpoint's), waking whoever waits on them.
  absl::Status ResetAccumulators(const std::vector<std::string>& names, int64_t step);
  // Waits at most `wait` for counter `name` to reach `at_least`; returns its value then.
  int64_t WaitForCounter(const std::string& name, int64_t at_least, absl::Duration wait);

  // Synchronous training. Adds each gradient to its variable's accumulator
  // unless local_step is not the accumulator's step (older: stale; newer:
  // from a worker that missed a restore) or
  // `worker` already gave one for the accumulator's step (a step counts
  // distinct workers); `accepted` says which were taken. Validated like ApplyGradients. With
  // apply_at > 0, an accumulator that now counts apply_at workers applies
  // the mean of their gradients with the variable's optimizer and moves to
  // the next step. `count_only`: the worker counts toward the step but its
  // tensors add nothing (leased data: this task applied their places from
  // another worker's update, and the step must not wait for a worker whose
  // tensors it will never take).
  absl::Status Accumulate(const std::vector<std::string>& names, const std::vector<torch::Tensor>& gradients,
                          int64_t local_step, const std::string& worker, std::vector<bool>* accepted,
                          int apply_at = 0, bool count_only = false);

  // Waits at most `wait` until every named accumulator has reached
  // `min_step`. Returns whether they have; `steps` gets each one's step and
  // `contributors` the workers heard from for the first one's current step.
  absl::StatusOr<bool> WaitForStep(const std::vector<std::string>& names, int64_t min_step, absl::Duration wait,
                                   std::vector<int64_t>* steps, std::vector<std::string>* contributors);

  struct ApplyAccumulatedResult {
    bool applied = false;
    std::vector<int> counts;
    std::vector<std::string> contributors;  // of the first variable's current step
  };
  // Waits at most `wait` until each accumulator holds `replicas_to_aggregate`
  // tensors, then uses each mean as `rule` says (see wire.proto) and moves
  // the accumulators to `new_step`. Idempotent for a step already applied.
  absl::StatusOr<ApplyAccumulatedResult> ApplyAccumulated(const std::vector<std::string>& names,
                                                          int replicas_to_aggregate, int64_t new_step,
                                                          absl::Duration wait,
                                                          wire::AccumulatedRule rule = wire::MEAN_GRADIENT);

  // Populations: gives the named variables' optimizers new hyper-parameters
  // (same kind), keeping their slots.
  absl::Status SetOptimizer(const std::vector<std::string>& names, const wire::OptimizerConfig& optimizer);

  // Copies of each variable's optimizer slots.
  absl::Status ReadSlots(const std::vector<std::string>& names, std::vector<OptimizerSlots>* slots) const;
  // Replaces each variable's slots; counts and shapes must match its optimizer's.
  absl::Status AssignSlots(const std::vector<std::string>& names, const std::vector<OptimizerSlots>& slots);

  // A copy of every variable with its slots, each taken under the
  // variable's lock so that value and slots belong together (a checkpoint
  // shard). Variables differ in how many applies they have seen, as any
  // save during asynchronous training would.
  std::vector<SavedVariable> Snapshot() const;

  // For each name: its definition and version, or nullopt-like absence.
  struct VariableInfo {
    bool present = false;
    wire::VariableDef def;
    int64_t version = 0;
  };
  std::vector<VariableInfo> Lookup(const std::vector<std::string>& names) const;

  const std::string& task_name() const { return task_name_; }
  // Bytes of the values and optimizer slots held: what the task's memory
  // holds besides its tables (their memory check counts it).
  int64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  // Variables (and partitions, and buffers) held.
  int64_t count() const;

 private:
  struct Variable {
    wire::VariableDef def;  // optimizer config with defaults filled in
    std::shared_ptr<const Optimizer> optimizer;  // null for a buffer; atomic_load/atomic_store: SetOptimizer replaces it
    torch::Tensor value;
    OptimizerSlots slots;
    std::atomic<int64_t> version{0};
    std::mutex update_mu;  // taken by apply/assign when Exclusive()
    // The SyncReplicas accumulator, guarded by accumulate_mu_.
    torch::Tensor gradient_sum;
    int accumulated = 0;  // tensors in gradient_sum
    int64_t accumulator_step = 0;
    std::vector<std::string> contributors;  // the workers the step counts (some may have added nothing)
  };

  // Whether updates to `var` take its update_mu: with use_locking, and always
  // for optimizers that keep slots.
  static bool Exclusive(const Variable& var);
  // Uses the mean of var's accumulated tensors as `rule` says (none: the
  // value stays), empties the accumulator and moves it to `new_step`. Under
  // accumulate_mu_.
  static void ApplyAccumulator(Variable& var, wire::AccumulatedRule rule, int64_t new_step);
  // Resolves every name or returns NotFound naming the first unknown one.
  absl::Status Find(const std::vector<std::string>& names,
                    std::vector<std::shared_ptr<Variable>>* found) const;
  // Validates the whole request, then runs `update` on each variable in turn
  // (under its lock when Exclusive) and bumps its version.
  absl::Status Update(const std::vector<std::string>& names, const std::vector<torch::Tensor>& tensors,
                      absl::string_view what, std::vector<int64_t>* versions,
                      const std::function<void(Variable&, const torch::Tensor&)>& update);
  // FailedPrecondition naming the first buffer in `vars`: what a gradient,
  // an accumulator or an optimizer may not touch.
  absl::Status RefuseBuffers(const std::vector<std::shared_ptr<Variable>>& vars, absl::string_view what) const;
  absl::Status CheckTensors(const std::vector<std::shared_ptr<Variable>>& vars,
                            const std::vector<torch::Tensor>& tensors, absl::string_view what,
                            bool require_finite) const;

  const std::string task_name_;
  mutable std::shared_mutex map_mu_;
  std::map<std::string, std::shared_ptr<Variable>> variables_;  // never erased
  std::atomic<int64_t> bytes_{0};
  std::mutex counter_mu_;
  std::condition_variable counter_changed_;
  std::map<std::string, int64_t> counters_;
  std::mutex accumulate_mu_;
  std::condition_variable accumulated_;
};

// Throws nothing: true when every element of `t` is finite (an integer
// tensor always is).
bool AllFinite(const torch::Tensor& t);

}  // namespace shoal

#endif  // SHOAL_SERVER_VARIABLE_STORE_H_
