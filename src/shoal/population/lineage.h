// The lineage of a population: each member's hyper-parameters, fitness and
// copies over time, as JSON lines (one file per member, so tasks never share
// a file), and the family-tree picture drawn from them (SVG).
#ifndef SHOAL_POPULATION_LINEAGE_H_
#define SHOAL_POPULATION_LINEAGE_H_

#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shoal/population/policy.h"

namespace shoal {

struct LineageEvent {
  int member = 0;
  int64_t step = 0;     // the member's step
  std::string event;    // start | eval | exploit | end
  double fitness = -1;  // validation accuracy; -1: not measured
  double loss = 0;
  int source = -1;      // exploit: the member copied
  std::string reason;   // exploit: why
  Hyperparameters hyperparameters;
};

// Appends one member's events to <dir>/member_<m>.jsonl.
class LineageLog {
 public:
  static absl::StatusOr<std::unique_ptr<LineageLog>> Open(const std::string& dir, int member, bool append);
  absl::Status Write(const LineageEvent& event);

 private:
  LineageLog(std::string path, bool append);
  std::string path_;
  std::ofstream out_;
};

// Every member_*.jsonl in `dir`, sorted by member and step. A malformed
// record is DataLoss naming the file and line.
absl::StatusOr<std::vector<LineageEvent>> ReadLineage(const std::string& dir);

// The family tree: a lane per member along the steps, coloured by fitness,
// with an arrow for every copy and the hyper-parameters after each change.
absl::Status DrawLineage(const std::vector<LineageEvent>& events, const std::string& svg_path);

// One line per member: final fitness, hyper-parameters, copies made and received.
std::string PopulationSummary(const std::vector<LineageEvent>& events);

}  // namespace shoal

#endif  // SHOAL_POPULATION_LINEAGE_H_
