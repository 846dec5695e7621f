// Reads the metrics files that MetricsHook writes (one per task, JSON lines
// or CSV) and draws loss and accuracy curves of all tasks into a PNG.
#ifndef SHOAL_REPORT_METRICS_PLOT_H_
#define SHOAL_REPORT_METRICS_PLOT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shoal {

struct MetricsPoint {
  double time_s = 0;
  int64_t local_step = 0;
  int64_t global_step = 0;
  double loss = 0;
  double accuracy = 0;
};

struct MetricsSeries {
  std::string task;  // "/job:worker/task:1"
  std::vector<MetricsPoint> points;
};

// One metrics file. A malformed record is DataLoss naming the file and line.
absl::StatusOr<MetricsSeries> ReadMetricsFile(const std::string& path);
// Every *.jsonl and *.csv file in `dir`, sorted by task; NotFound if none.
absl::StatusOr<std::vector<MetricsSeries>> ReadMetricsDir(const std::string& dir);

// Two panels against the global step, loss and batch accuracy, a line per
// task, written as a PNG to `path`.
absl::Status PlotMetrics(const std::vector<MetricsSeries>& series, const std::string& path);

}  // namespace shoal

#endif  // SHOAL_REPORT_METRICS_PLOT_H_
