// What a finished job reports: the chief fills it (the strategies that have
// more to say add their part), the CLI prints it, result files carry it.
#ifndef SHOAL_STRATEGY_TRAIN_REPORT_H_
#define SHOAL_STRATEGY_TRAIN_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace shoal {

// Where one worker's training time went (telemetry/phase.h): seconds in
// each phase, their own (a wait inside a push is waiting), and the rest.
struct TaskTime {
  std::string task;  // "worker:1"
  int64_t steps = 0;
  double seconds = 0;  // training, start to end
  double compute = 0, communication = 0, waiting = 0, checkpoint = 0;
};

// One member of a population, at the end.
struct MemberReport {
  int member = 0;
  double fitness = -1;  // validation accuracy
  double test_accuracy = 0;
  std::string hyperparameters;
};

// The exactly-once check of a job on leased data (CheckJobLedgers): over
// the epochs the ledgers keep, places each ps task applied, places missing
// from a finished epoch on some task, and places applied again.
struct DataLedgerReport {
  bool leased = false;
  int64_t epochs_finished = 0;
  int64_t epochs_checked = 0;
  int64_t places_applied = 0;  // the least over the tasks, summed over epochs
  int64_t places_missing = 0;
  int64_t places_repeated = 0;
  // The ledgers checked: the variables' on each ps task holding some, and
  // each table's rows' on each ps task (a model with embedding tables).
  int64_t variable_ledgers = 0;
  int64_t table_ledgers = 0;
  int64_t leases_taken = 0;  // by the chief's own worker
  // Shards another worker took over once their holder stopped renewing
  // (died, stalled or left): how many, and the seconds from the holder's
  // last update to the takeover (mean, longest).
  int64_t takeovers = 0;
  double takeover_seconds_mean = 0;
  double takeover_seconds_max = 0;
  // Workers that joined the running job, and their mean seconds from start
  // to their first applied update.
  int64_t joins = 0;
  double join_seconds_mean = 0;
};

struct TrainReport {
  double test_accuracy = 0;  // classification (model.loss cross_entropy)
  double test_loss = 0;      // the mean loss on the test set (mse: the regression's figure; clicks: log loss)
  double test_auc = 0;       // clicks (model.kind click): the AUC on the test set
  double row_cache_hit_rate = 0;  // clicks with model.click.cache_rows: distinct ids served by the workers' caches
  // Models with embedding tables, over their shards at the end: rows held,
  // new ids a full dynamic table turned away, rows evicted to make room.
  int64_t table_rows_held = 0;
  int64_t table_ids_refused = 0;
  int64_t table_rows_evicted = 0;
  int64_t global_step = 0;
  double seconds = 0;
  double examples_per_second = 0;         // over the whole session, start-up included
  double steady_examples_per_second = 0;  // after the warm-up global steps (benchmarks)
  double last_loss = 0;
  int64_t stale_gradients_dropped = 0;  // sync: late gradients left out of a step
  std::string stop_reason;              // why a hook stopped the job early; empty if it ran to the end
  std::string restored_from;            // the checkpoint the chief resumed from; empty if none
  std::string last_checkpoint;          // the checkpoint saved at the end; empty if none
  // The chief's checkpoints before the end (checkpoint.every_steps,
  // every_seconds): how many; the seconds its training waited for them,
  // when it trains nothing; the seconds they took; whether they were
  // written in the background (checkpoint.background).
  int64_t checkpoints_saved = 0;
  double checkpoint_seconds = 0;
  double checkpoint_save_seconds = 0;
  bool checkpoints_in_background = false;
  std::vector<std::string> restarts;    // the local launcher's: which task failed how, and its restart
  std::vector<std::string> recoveries;  // the chief's restores after a task lost its variables mid-job
  // Checkpoints restored onto the job by any task (the chief's, a population
  // member's lead's), start-up included.
  int64_t restores = 0;
  int unfinished_workers = 0;           // workers that had not finished when the chief evaluated (dead ones)
  // Leased data (data.leases): what every ps task's exactly-once ledger says.
  DataLedgerReport data_ledger;
  // The chief's compute: its BLAS threads, why that many, libtorch's
  // intra-op threads beside them, and the BLAS its matrix products ran on.
  int compute_threads = 0;
  std::string compute_threads_source;
  int intra_op_threads = 0;
  std::string blas;
  // What the workers' clients sent and received during training (frames:
  // headers and tensors; start-up left out), all workers together, and the
  // epochs trained, for rates per epoch.
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t tensor_bytes_sent = 0;  // of bytes_sent, the tensors alone
  // Steps the workers finished, all together (in async mode each pushed one
  // update, so this equals the global steps trained: none lost, none applied
  // twice), and calls their clients sent again because a task was unreachable.
  int64_t worker_steps = 0;
  int64_t calls_retried = 0;
  double epochs_trained = 0;
  // population: every member, the best by validation fitness (whose test
  // accuracy is test_accuracy above), bytes moved to read other members
  // (fitness, hyper-parameters, weights, slots), and the summary.
  std::vector<MemberReport> members;
  int best_member = -1;
  int64_t peer_bytes_read = 0;
  std::string population_summary;
  // population: ready intervals by the copies made in them ([with 0, with 1,
  // ...]), the copies, and those whose copier was the worst it ranked.
  std::vector<int64_t> copies_per_interval;
  int64_t copies = 0;
  int64_t copies_by_the_worst = 0;
  std::vector<int64_t> ssp_gap_histogram;  // ssp: steps that began g steps ahead of the slowest, by g
  // gated: each network alone on the test set, and the uniform average of
  // their softmax outputs (test_accuracy is the master-weighted vote's).
  std::vector<double> network_test_accuracies;
  double uniform_average_accuracy = 0;
  double any_network_right = 0;              // the ceiling for a perfect gate
  std::vector<double> network_mean_weights;  // the master's mean weight for each network
  // The trained model (TrainingMode::Final: the ps's values at the end; a
  // population's fittest member, a gated ensemble whole): every variable's
  // and buffer's value by name, for the caller's own module. Not in the
  // JSON: tensors travel in weights files (session/run_folder.h).
  std::vector<std::string> trained_names;
  std::vector<torch::Tensor> trained_values;
  int trained_member = -1;  // population: which member they are
  // The run folder the chief wrote (hooks.run_dir): model.pt (unless the
  // model has no TorchScript form: why in no_model_file), weights.pt and
  // report.json. Empty when hooks.run_dir is.
  std::string run_dir;
  std::string model_file;
  std::string no_model_file;
  // Where the workers' time went, one entry each (the job's summary).
  std::vector<TaskTime> task_times;
};

// The summary people read when scaling does not pay: the workers' time as
// compute, communication, waiting, checkpoint and other fractions, and the
// slowest worker by seconds per step. Empty without task times.
std::string TimeSummary(const TrainReport& report);

// The report as JSON (the result file `shoal worker --result_file` writes and
// the local launcher reads back), and back; missing keys keep defaults.
nlohmann::json ReportToJson(const TrainReport& report);
absl::StatusOr<TrainReport> ReportFromJson(const nlohmann::json& json);

}  // namespace shoal

#endif  // SHOAL_STRATEGY_TRAIN_REPORT_H_
