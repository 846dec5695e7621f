#include "shoal/strategy/train_report.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shoal {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TaskTime, task, steps, seconds, compute, communication, waiting,
                                                checkpoint)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(DataLedgerReport, leased, epochs_finished, epochs_checked,
                                                places_applied, places_missing, places_repeated,
                                                variable_ledgers, table_ledgers, leases_taken,
                                                takeovers, takeover_seconds_mean, takeover_seconds_max, joins,
                                                join_seconds_mean)
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
                                                unfinished_workers, data_ledger, compute_threads, compute_threads_source, intra_op_threads,
                                                blas, worker_steps, calls_retried, trained_member, run_dir,
                                                model_file, no_model_file, task_times)

std::string TimeSummary(const TrainReport& report) {
  double total = 0, compute = 0, communication = 0, waiting = 0, checkpoint = 0;
  const TaskTime* slowest = nullptr;
  auto per_step = [](const TaskTime& t) { return t.steps > 0 ? t.seconds / t.steps : 0.0; };
  for (const TaskTime& t : report.task_times) {
    total += t.seconds;
    compute += t.compute;
    communication += t.communication;
    waiting += t.waiting;
    checkpoint += t.checkpoint;
    if (t.steps > 0 && (slowest == nullptr || per_step(t) > per_step(*slowest))) slowest = &t;
  }
  if (total <= 0) return "";
  const double other = std::max(0.0, total - compute - communication - waiting - checkpoint);
  std::string summary = absl::StrFormat(
      "workers' time: compute %.0f%%, communication %.0f%%, waiting %.0f%%, checkpoints %.0f%%, other %.0f%%",
      100 * compute / total, 100 * communication / total, 100 * waiting / total, 100 * checkpoint / total,
      100 * other / total);
  if (slowest != nullptr && report.task_times.size() > 1) {
    absl::StrAppendFormat(&summary,
                          "\nslowest worker: %s, %.2f ms a step (compute %.0f%%, communication %.0f%%, waiting %.0f%%)",
                          slowest->task, 1000 * per_step(*slowest), 100 * slowest->compute / slowest->seconds,
                          100 * slowest->communication / slowest->seconds, 100 * slowest->waiting / slowest->seconds);
  }
  return summary;
}

nlohmann::json ReportToJson(const TrainReport& report) { return report; }

absl::StatusOr<TrainReport> ReportFromJson(const nlohmann::json& json) {
  try {
    return json.get<TrainReport>();
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat("malformed training result: ", e.what()));
  }
}

}  // namespace shoal
