// TrainingMode: everything shoal knows of one training mode, in one place:
// its strategy, the options it checks, what the ps hold for it and where,
// how the training set is split, how many examples a step takes, what a
// checkpoint keeps, the chief's report, and the buffer rule. Each mode's own
// file in strategy/ defines its TrainingMode; the table in training_mode.cc
// lists them, one row each. Nothing outside strategy/ branches on a mode's
// name: the session, the config and the command line ask the table.
//
// Thread-safe: the modes are constant.
#ifndef SHOAL_STRATEGY_TRAINING_MODE_H_
#define SHOAL_STRATEGY_TRAINING_MODE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/strategy/strategy.h"
#include "shoal/strategy/train_report.h"

namespace shoal {

// Reads tensors by name: the ps's at a job's end (Client::Read), or a
// checkpoint's (`shoal export`).
using ReadTensors = std::function<absl::StatusOr<std::vector<torch::Tensor>>(const std::vector<std::string>& names)>;

// The model a job trained, as the chief hands it back and `shoal export`
// writes it.
struct FinalModel {
  // Its variables' and buffers' values, by the names the model gives them:
  // a user's module's own (named_parameters(), named_buffers()), a built-in
  // model's ("dense_1/kernel"); a population member's scope is left off.
  std::vector<std::string> names;
  std::vector<torch::Tensor> values;
  int member = -1;  // population: the member it is
  // Its TorchScript form (Model::Script), or why it has none.
  absl::StatusOr<torch::jit::Module> script = absl::UnimplementedError("not scripted");
};

class TrainingMode {
 public:
  virtual ~TrainingMode() = default;

  // The name `training.mode` gives.
  virtual std::string name() const = 0;
  virtual std::unique_ptr<TrainingStrategy> MakeStrategy() const = 0;

  // The ps's optimizer when the config names none: adam 0.001, halved every
  // 1,500 applies.
  virtual wire::OptimizerConfig DefaultOptimizer() const;
  // Checks the options only this mode reads, beyond each section's own
  // checks; `workers` is the number of training tasks, or 0 when a cluster
  // file gives it only at start. An error names the key.
  virtual absl::Status Validate(const StrategyConfig& /*config*/, int /*workers*/) const { return absl::OkStatus(); }
  // Whether the mode trains classifiers only (model.loss cross_entropy).
  virtual bool ClassifiesOnly() const { return false; }
  // One line for logs naming what the job trains (default: ModelSummary).
  virtual std::string Summary(const StrategyConfig& config, int workers) const;

  // What the ps tasks hold: by default the model's variables and buffers.
  virtual absl::StatusOr<std::vector<VariableSpec>> Variables(const StrategyConfig& config, int workers) const;
  // Placement rules beyond the configured ones (a member's variables on its
  // own task, the gated exchange on the chief).
  virtual std::vector<ScopeRule> ScopeRules(const StrategyConfig& /*config*/, const std::vector<TaskId>& /*workers*/,
                                            const TaskId& /*chief*/) const {
    return {};
  }
  // Whether training tasks host variables (a population's members), so that
  // they serve until the chief has read them for the report.
  virtual bool WorkersHostVariables() const { return false; }

  // The worker's share of `train` into context.train_shard (and
  // context.validation): by default the worker_index-th of num_workers
  // shards.
  virtual void SplitData(const StrategyConfig& config, const Dataset& train, WorkerContext& context) const;
  // Examples one global step consumes (default: one batch), and those the
  // job trains on per epoch of a training set of `train_examples` (default:
  // all of them, once).
  virtual int64_t ExamplesPerStep(const StrategyConfig& config, int workers) const;
  virtual int64_t ExamplesPerEpoch(const StrategyConfig& /*config*/, int64_t train_examples, int /*workers*/) const {
    return train_examples;
  }

  // Counters besides the job's that a checkpoint keeps.
  virtual std::vector<std::string> SavedCounters(const StrategyConfig& /*config*/, int /*workers*/) const {
    return {};
  }
  // Whether each worker's place in its data (DataPositionCounter) is kept
  // and read on from: the modes on the step driver and populations. The
  // gated ensemble draws a batch a lockstep step, so its step says where its
  // data stands.
  virtual bool KeepsDataPosition() const { return true; }
  // Whether the mode can train from leased data (data.leases): its push
  // carries each step's places (StepPolicy, LeasedData). Async, sync,
  // downpour and model_average (a push or a copy carries its local steps').
  virtual bool LeasesData() const { return false; }
  // Whether a checkpoint must hold one global step's values (the ps change
  // in lockstep), so that the chief trains nothing while one is written;
  // otherwise it saves in the background (checkpoint.background: auto).
  virtual bool CheckpointsHoldOneStep() const { return false; }
  // Whether one model is trained, so that an evaluator task can follow its
  // checkpoints.
  virtual bool TrainsOneModel() const { return true; }
  // The chief's report once every worker is done: by default the one
  // model's test accuracy and loss, read from the ps.
  virtual absl::Status Report(WorkerContext& context, const Dataset& test_set, TrainReport* report) const;
  // The trained model, its values read through `read`: by default the one
  // model's variables and buffers. `member` picks a population's member
  // (-1: the fittest by its last measured fitness); InvalidArgument for a
  // member that does not exist, or any member of a mode without them. A
  // value whose shape or dtype is not the model's is InvalidArgument naming
  // the variable (values from another model's checkpoint).
  virtual absl::StatusOr<FinalModel> Final(const StrategyConfig& config, int workers, const ReadTensors& read,
                                           int member) const;
};

// `names` read through `read`, checked against `shapes` and `dtypes` (what
// the model holds): InvalidArgument naming the first that differs.
absl::StatusOr<std::vector<torch::Tensor>> ReadChecked(const ReadTensors& read, const std::vector<std::string>& names,
                                                       const std::vector<torch::Tensor>& like);
// `model` with its variables and buffers read through `read` (checked),
// scripted in evaluation mode; the names are the model's less `scope`.
absl::StatusOr<FinalModel> FinalOf(Model& model, const ReadTensors& read, const std::string& scope = "");

// The mode `name` names; InvalidArgument listing the known ones otherwise.
absl::StatusOr<const TrainingMode*> FindMode(const std::string& name);
// Every mode's name, in the table's order.
std::vector<std::string> ModeNames();
// The strategy for `config.training.mode`.
absl::StatusOr<std::unique_ptr<TrainingStrategy>> MakeStrategy(const StrategyConfig& config);
// Examples one global step of the job consumes (the mode's ExamplesPerStep).
int64_t ExamplesPerStep(const StrategyConfig& config, int num_workers);
// Global steps for `config` over a training set of `train_examples`:
// training.max_steps, else the epochs of the mode's examples per epoch,
// rounded up to whole steps.
int64_t MaxSteps(const StrategyConfig& config, int64_t train_examples, int num_workers);
// The ps's optimizer for `mode` when the config names none (an unknown mode:
// the default one; validation names the mode).
wire::OptimizerConfig DefaultOptimizer(const std::string& mode);

}  // namespace shoal

#endif  // SHOAL_STRATEGY_TRAINING_MODE_H_
