#include "shoal/strategy/train_report.h"

#include "absl/strings/str_cat.h"

namespace shoal {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(MemberReport, member, fitness, test_accuracy, hyperparameters)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TrainReport, test_accuracy, test_loss, test_auc, row_cache_hit_rate,
                                                table_rows_held, table_ids_refused, table_rows_evicted,
                                                global_step, seconds, examples_per_second,
                                                steady_examples_per_second, last_loss, stale_gradients_dropped,
                                                ssp_gap_histogram, stop_reason, bytes_sent, bytes_received,
                                                tensor_bytes_sent, epochs_trained, members, best_member,
                                                peer_bytes_read, population_summary, copies_per_interval, copies,
                                                copies_by_the_worst, network_test_accuracies,
                                                uniform_average_accuracy, any_network_right, network_mean_weights,
                                                restored_from, last_checkpoint, checkpoints_saved,
                                                checkpoint_seconds, checkpoint_save_seconds, checkpoints_in_background,
                                                restarts, recoveries, restores,
                                                unfinished_workers, compute_threads, compute_threads_source, intra_op_threads,
                                                blas, worker_steps, calls_retried, trained_member, run_dir,
                                                model_file, no_model_file)

nlohmann::json ReportToJson(const TrainReport& report) { return report; }

absl::StatusOr<TrainReport> ReportFromJson(const nlohmann::json& json) {
  try {
    return json.get<TrainReport>();
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat("malformed training result: ", e.what()));
  }
}

}  // namespace shoal
