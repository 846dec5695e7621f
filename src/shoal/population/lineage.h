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
  // start | eval | exploit (a decision to copy) | keep (a decision not to) |
  // rejoin (after a lost task: the fitness it now carries) | end
  std::string event;
  double fitness = -1;  // validation accuracy (exploit: the donor's, now carried); -1: not measured
  double loss = 0;
  int source = -1;      // exploit: the member copied
  std::string reason;   // exploit: why; keep: why not, when the policy could not rank everyone
  Hyperparameters hyperparameters;
  // exploit and keep: the fitness of every member as the decision saw it
  // (-1: none yet, or unreachable), and the member step each was published at.
  std::vector<double> seen;
  std::vector<int64_t> seen_steps;
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

// How the copies fell: per ready interval (decisions at member steps near
// k * ready_steps count in interval k), and whether each copier was the worst
// ranked among what it saw.
struct CopyStatistics {
  std::vector<int64_t> copies_per_interval;  // [intervals with 0 copies, with 1, with 2, ...]
  int64_t copies = 0;
  int64_t copies_by_the_worst = 0;  // the copier's fitness was the lowest it saw (ties included)
};
CopyStatistics CountCopies(const std::vector<LineageEvent>& events, int64_t ready_steps);

// One line per member: final fitness, hyper-parameters, copies made and
// received; then the copy statistics.
std::string PopulationSummary(const std::vector<LineageEvent>& events, int64_t ready_steps);

}  // namespace shoal

#endif  // SHOAL_POPULATION_LINEAGE_H_
