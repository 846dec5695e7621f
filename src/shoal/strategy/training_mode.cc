#include "shoal/strategy/training_mode.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shoal/core/dtype.h"
#include "shoal/core/status.h"
#include "shoal/model/row_tables.h"
#include "shoal/strategy/async_strategy.h"
#include "shoal/strategy/gated_strategy.h"
#include "shoal/strategy/local_replica.h"
#include "shoal/strategy/population_strategy.h"
#include "shoal/strategy/ssp_strategy.h"
#include "shoal/strategy/sync_strategy.h"

namespace shoal {
namespace {

// The modes, one row each. A new mode: its file in strategy/ and a row here.
const std::vector<const TrainingMode*>& Table() {
  static const std::vector<const TrainingMode*> modes = {
      &AsyncMode(),        &SyncMode(),     &SspMode(),      &DownpourMode(), &ModelAverageMode(),
      &ElasticAverageMode(), &PopulationMode(), &GatedMode(),
  };
  return modes;
}

}  // namespace

absl::StatusOr<const TrainingMode*> FindMode(const std::string& name) {
  for (const TrainingMode* mode : Table()) {
    if (mode->name() == name) return mode;
  }
  return absl::InvalidArgumentError(absl::StrCat("config: 'training.mode' '", name, "' is unknown; known: ",
                                                 absl::StrJoin(ModeNames(), ", ")));
}

std::vector<std::string> ModeNames() {
  std::vector<std::string> names;
  for (const TrainingMode* mode : Table()) names.push_back(mode->name());
  return names;
}

wire::OptimizerConfig DefaultOptimizer(const std::string& mode) {
  auto found = FindMode(mode);
  return found.ok() ? (*found)->DefaultOptimizer() : AsyncMode().DefaultOptimizer();
}

wire::OptimizerConfig TrainingMode::DefaultOptimizer() const {
  wire::OptimizerConfig o;
  o.set_kind("adam");
  o.set_learning_rate(0.001);
  // Halving the step size every 1500 applies settles async noise late in
  // the 5-epoch default job (about +1% test accuracy, measured).
  o.set_lr_decay_rate(0.5);
  o.set_lr_decay_steps(1500);
  return o;
}

std::string TrainingMode::Summary(const StrategyConfig& config, int /*workers*/) const {
  return ModelSummary(config.model);
}

absl::StatusOr<std::vector<VariableSpec>> TrainingMode::Variables(const StrategyConfig& config,
                                                                  int /*workers*/) const {
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, MakeModel(config.model));
  std::vector<VariableSpec> specs = model->VariableSpecs();
  for (const VariableSpec& buffer : model->BufferSpecs()) specs.push_back(buffer);  // placed like the variables
  return specs;
}

void TrainingMode::SplitData(const StrategyConfig& /*config*/, const Dataset& train, WorkerContext& context) const {
  context.train_shard = train.Shard(context.worker_index, context.num_workers);
}

int64_t TrainingMode::ExamplesPerStep(const StrategyConfig& config, int /*workers*/) const {
  return config.training.batch_size;
}

absl::Status TrainingMode::Report(WorkerContext& context, const Dataset& test_set, TrainReport* report) const {
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, MakeModel(context.config->model));
  SHOAL_RETURN_IF_ERROR(PullVariablesAndBuffers(*context.client, *model));
  if (RowTables* tables = model->row_tables()) tables->Bind(context.client);
  model->SetTraining(false);
  SHOAL_ASSIGN_OR_RETURN(const Evaluation figures, Evaluate(*model, test_set));
  report->test_accuracy = figures.accuracy;
  report->test_loss = figures.loss;
  report->test_auc = figures.auc;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<torch::Tensor>> ReadChecked(const ReadTensors& read, const std::vector<std::string>& names,
                                                       const std::vector<torch::Tensor>& like) {
  SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> values, read(names));
  if (values.size() != names.size()) {
    return absl::InternalError(absl::StrCat("read ", values.size(), " tensors for ", names.size(), " names"));
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (!values[i].sizes().equals(like[i].sizes()) || values[i].scalar_type() != like[i].scalar_type()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "variable '", names[i], "' is ", DTypeName(values[i].scalar_type()), " ", ShapeString(values[i].sizes()),
          " where the configured model has ", DTypeName(like[i].scalar_type()), " ",
          ShapeString(like[i].sizes()), ": these values are another model's"));
    }
  }
  return values;
}

absl::StatusOr<FinalModel> TrainingMode::Final(const StrategyConfig& config, int /*workers*/, const ReadTensors& read,
                                               int member) const {
  if (member >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a member (", member, ") picks one of a population's models; mode '", name(), "' trains one"));
  }
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, MakeModel(config.model));
  return FinalOf(*model, read);
}

absl::StatusOr<FinalModel> FinalOf(Model& model, const ReadTensors& read, const std::string& scope) {
  FinalModel final_model;
  std::vector<torch::Tensor> like = model.variables();
  like.insert(like.end(), model.buffers().begin(), model.buffers().end());
  SHOAL_ASSIGN_OR_RETURN(final_model.values, ReadChecked(read, model.StateNames(), like));
  for (const std::string& name : model.StateNames()) final_model.names.push_back(name.substr(scope.size()));
  model.LoadState(final_model.values);
  model.SetTraining(false);
  final_model.script = model.Script();
  return final_model;
}

absl::StatusOr<std::unique_ptr<TrainingStrategy>> MakeStrategy(const StrategyConfig& config) {
  SHOAL_ASSIGN_OR_RETURN(const TrainingMode* mode, FindMode(config.training.mode));
  return mode->MakeStrategy();
}

int64_t ExamplesPerStep(const StrategyConfig& config, int num_workers) {
  auto mode = FindMode(config.training.mode);
  return mode.ok() ? (*mode)->ExamplesPerStep(config, num_workers) : config.training.batch_size;
}

int64_t MaxSteps(const StrategyConfig& config, int64_t train_examples, int num_workers) {
  if (config.training.max_steps > 0) return config.training.max_steps;
  auto mode = FindMode(config.training.mode);
  const int64_t per_epoch = mode.ok() ? (*mode)->ExamplesPerEpoch(config, train_examples, num_workers) : train_examples;
  const int64_t per_step = ExamplesPerStep(config, num_workers);
  const int64_t examples = config.training.epochs * per_epoch;
  return std::max<int64_t>(1, (examples + per_step - 1) / per_step);
}

}  // namespace shoal
