#include "shoal/session/evaluator.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "shoal/checkpoint/checkpoint.h"
#include "shoal/client/client.h"
#include "shoal/cluster/cluster_spec.h"
#include "shoal/core/status.h"
#include "shoal/model/row_tables.h"
#include "shoal/placement/placement.h"
#include "shoal/server/table_checkpoint.h"
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

// Each table's distinct ids (sorted) that evaluating `test_set` pulls,
// gathered a batch at a time.
absl::StatusOr<std::map<std::string, std::vector<int64_t>>> IdsEvaluated(const RowTables& tables,
                                                                        const Dataset& test_set) {
  constexpr int64_t kBatch = 1 << 16;
  const std::vector<wire::TableDef> defs = tables.TableDefs();
  std::vector<std::vector<torch::Tensor>> parts(defs.size());
  for (int64_t begin = 0; begin < test_set.size(); begin += kBatch) {
    const int64_t n = std::min(kBatch, test_set.size() - begin);
    SHOAL_ASSIGN_OR_RETURN(std::vector<torch::Tensor> ids, tables.TableIds(test_set.images.narrow(0, begin, n)));
    for (size_t t = 0; t < defs.size(); ++t) parts[t].push_back(std::move(ids[t]));
  }
  std::map<std::string, std::vector<int64_t>> wanted;
  for (size_t t = 0; t < defs.size(); ++t) {
    std::vector<int64_t>& ids = wanted[defs[t].name()];
    if (parts[t].empty()) continue;
    const torch::Tensor distinct = std::get<0>(torch::_unique(torch::cat(parts[t]), /*sorted=*/true)).contiguous();
    ids.assign(distinct.data_ptr<int64_t>(), distinct.data_ptr<int64_t>() + distinct.numel());
  }
  return wanted;
}

// A checkpoint's embedding tables, served to this process by an in-process
// ps task that restored them from the table shards (any ps count saved
// them), and a client for them. The tables are read-only and hold only the
// rows of the ids evaluating the test set pulls, without the optimizer's
// slots: a table larger than the evaluator's memory is evaluated all the
// same, and the rest of its rows are never read.
class CheckpointTables {
 public:
  static absl::StatusOr<std::unique_ptr<CheckpointTables>> Restore(const std::string& checkpoint,
                                                                   const CheckpointIndex& index, const Model& model,
                                                                   const RowTables& row_tables,
                                                                   const Dataset& test_set) {
    if (index.table_shards.empty()) {
      return absl::NotFoundError(absl::StrCat("checkpoint ", checkpoint, " holds no tables for the click model"));
    }
    SHOAL_ASSIGN_OR_RETURN(const auto wanted, IdsEvaluated(row_tables, test_set));
    std::unique_ptr<CheckpointTables> served(new CheckpointTables());
    VariableServiceOptions options;
    options.task_name = "/job:evaluator/task:0 (the checkpoint's tables)";
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
    std::vector<wire::TableDef> tables = row_tables.TableDefs();
    for (wire::TableDef& table : tables) table.set_read_only(true);
    SHOAL_RETURN_IF_ERROR(served->client_->CreateTables(tables));
    // The shards' files, named from the index's numbers, read in this
    // process: only the wanted rows are kept.
    std::vector<std::string> files;
    for (int shard : index.table_shards) {
      files.push_back((std::filesystem::path(checkpoint) / TableFileName(shard)).string());
    }
    SHOAL_ASSIGN_OR_RETURN(served->rows_, RestoreTables(served->service_->tables(), files, &wanted));
    return served;
  }
  Client* client() const { return client_.get(); }
  int64_t rows() const { return rows_; }

 private:
  CheckpointTables() = default;
  // Destroyed in reverse: the client before the server it calls.
  InProcNetwork network_;
  std::unique_ptr<VariableService> service_;
  std::unique_ptr<InProcTransport> transport_;
  std::unique_ptr<ServerHandle> server_;
  std::unique_ptr<Client> client_;
  int64_t rows_ = 0;  // restored
};

}  // namespace

absl::StatusOr<CheckpointEvaluation> EvaluateCheckpoint(const JobConfig& config, const std::string& checkpoint,
                                                        const Dataset& test_set) {
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Model> built, MakeModel(config.model));
  Model& model = *built;
  // The variables, then the buffers (BatchNorm statistics) saved beside them.
  CheckpointIndex index;
  SHOAL_ASSIGN_OR_RETURN(std::vector<CheckpointVariable> chosen,
                         LoadVariables(checkpoint, model.StateNames(), model.StateShapes(), &index));
  std::vector<torch::Tensor> values;
  for (auto& v : chosen) values.push_back(v.value);
  model.LoadState(values);
  std::unique_ptr<CheckpointTables> tables;
  if (RowTables* row_tables = model.row_tables()) {
    SHOAL_ASSIGN_OR_RETURN(tables, CheckpointTables::Restore(checkpoint, index, model, *row_tables, test_set));
    row_tables->Bind(tables->client());
  }
  model.SetTraining(false);
  CheckpointEvaluation result;
  result.checkpoint = checkpoint;
  result.global_step = index.step;
  SHOAL_ASSIGN_OR_RETURN(const Evaluation figures, Evaluate(model, test_set));
  result.test_accuracy = figures.accuracy;
  result.test_loss = figures.loss;
  if (tables != nullptr) {
    result.test_auc = figures.auc;
    result.table_rows = tables->rows();
  }
  return result;
}

std::string EvaluationJsonLine(const std::string& task, const CheckpointEvaluation& evaluation) {
  nlohmann::json line = {{"task", task},
                         {"global_step", evaluation.global_step},
                         {"test_accuracy", evaluation.test_accuracy},
                         {"test_loss", evaluation.test_loss},
                         {"checkpoint", evaluation.checkpoint},
                         {"unix_time", absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch())}};
  if (evaluation.test_auc.has_value()) {
    line["test_auc"] = *evaluation.test_auc;
    line["table_rows"] = evaluation.table_rows;
  }
  return line.dump();
}

}  // namespace shoal
