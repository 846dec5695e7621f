#include "shoal/session/evaluator.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/client/client.h"
#include "shoal/cluster/cluster_spec.h"
#include "shoal/core/status.h"
#include "shoal/model/row_tables.h"
#include "shoal/placement/placement.h"
#include "shoal/server/variable_service.h"
#include "shoal/strategy/training_mode.h"
#include "shoal/transport/inproc/inproc_transport.h"

namespace shoal {

absl::Status CheckEvaluatorConfig(const JobConfig& config) {
  if (config.checkpoint.dir.empty()) {
    return absl::FailedPreconditionError(
        "an evaluator task evaluates the chief's checkpoints: set checkpoint.dir (a folder every task can read)");
  }
  SHOAL_ASSIGN_OR_RETURN(const TrainingMode* mode, FindMode(config.training.mode));
  if (!mode->TrainsOneModel()) {
    return absl::FailedPreconditionError(absl::StrCat("an evaluator task evaluates one model per checkpoint; mode '",
                                                      config.training.mode,
                                                      "' trains several (its chief reports each)"));
  }
  return absl::OkStatus();
}

namespace {

// A checkpoint's embedding tables, served to this process by an in-process
// ps task that restored them from the table shards (any ps count saved
// them), and a client for them. The tables are read-only: their rows come
// back without the optimizer's slots, which would double (Adagrad) or
// triple (LazyAdam, FTRL) what evaluating holds.
class CheckpointTables {
 public:
  static absl::StatusOr<std::unique_ptr<CheckpointTables>> Restore(const std::string& checkpoint,
                                                                   const CheckpointIndex& index, const Model& model,
                                                                   std::vector<wire::TableDef> tables) {
    if (index.table_shards.empty()) {
      return absl::NotFoundError(absl::StrCat("checkpoint ", checkpoint, " holds no tables for the click model"));
    }
    std::unique_ptr<CheckpointTables> served(new CheckpointTables());
    // The service finds the shards by step under its checkpoint folder,
    // as a ps task does.
    VariableServiceOptions options;
    options.task_name = "/job:evaluator/task:0 (the checkpoint's tables)";
    options.checkpoint_dir = std::filesystem::path(checkpoint).parent_path().string();
    served->service_ = std::make_unique<VariableService>(options);
    served->transport_ = std::make_unique<InProcTransport>(&served->network_);
    SHOAL_ASSIGN_OR_RETURN(served->server_, served->transport_->Serve("inproc:tables:0", served->service_.get()));
    // (A cluster names its workers; this one's, the evaluator, is never dialled.)
    SHOAL_ASSIGN_OR_RETURN(ClusterSpec cluster, ClusterSpec::Create({{"ps", {served->server_->address()}},
                                                                     {"chief", {"inproc:evaluator:0"}}}));
    SHOAL_ASSIGN_OR_RETURN(Placement placement, Placement::Create(model.VariableSpecs(), cluster, {}));
    SHOAL_ASSIGN_OR_RETURN(served->client_,
                           Client::Create(cluster, served->transport_.get(),
                                          std::make_shared<const Placement>(std::move(placement))));
    for (wire::TableDef& table : tables) table.set_read_only(true);
    SHOAL_RETURN_IF_ERROR(served->client_->CreateTables(tables));
    SHOAL_RETURN_IF_ERROR(served->client_->RestoreTables(index.step, index.table_shards).status());
    return served;
  }
  Client* client() const { return client_.get(); }

 private:
  CheckpointTables() = default;
  // Destroyed in reverse: the client before the server it calls.
  InProcNetwork network_;
  std::unique_ptr<VariableService> service_;
  std::unique_ptr<InProcTransport> transport_;
  std::unique_ptr<ServerHandle> server_;
  std::unique_ptr<Client> client_;
};

}  // namespace

absl::StatusOr<CheckpointEvaluation> EvaluateCheckpoint(const JobConfig& config, const std::string& checkpoint,
                                                        const Dataset& test_set) {
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> built, MakeModel(config.model));
  Model& model = *built;
  // The variables, then the buffers (BatchNorm statistics) saved beside them.
  CheckpointIndex index;
  SHOAL_ASSIGN_OR_RETURN(std::vector<CheckpointVariable> all, LoadCheckpoint(checkpoint, &index));
  SHOAL_ASSIGN_OR_RETURN(std::vector<CheckpointVariable> chosen,
                         SelectVariables(std::move(all), model.StateNames(), model.StateShapes(), checkpoint));
  std::vector<torch::Tensor> values;
  for (auto& v : chosen) values.push_back(v.value);
  model.LoadState(values);
  std::unique_ptr<CheckpointTables> tables;
  if (RowTables* row_tables = model.row_tables()) {
    SHOAL_ASSIGN_OR_RETURN(tables, CheckpointTables::Restore(checkpoint, index, model, row_tables->TableDefs()));
    row_tables->Bind(tables->client());
  }
  model.SetTraining(false);
  CheckpointEvaluation result;
  result.checkpoint = checkpoint;
  result.global_step = index.step;
  SHOAL_ASSIGN_OR_RETURN(const Evaluation figures, Evaluate(model, test_set));
  result.test_accuracy = figures.accuracy;
  result.test_loss = figures.loss;
  if (tables != nullptr) result.test_auc = figures.auc;
  return result;
}

std::string EvaluationJsonLine(const std::string& task, const CheckpointEvaluation& evaluation) {
  nlohmann::json line = {{"task", task},
                         {"global_step", evaluation.global_step},
                         {"test_accuracy", evaluation.test_accuracy},
                         {"test_loss", evaluation.test_loss},
                         {"checkpoint", evaluation.checkpoint},
                         {"unix_time", absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch())}};
  if (evaluation.test_auc.has_value()) line["test_auc"] = *evaluation.test_auc;
  return line.dump();
}

}  // namespace shoal
