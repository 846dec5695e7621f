// ProgressReporter: the live line a person watches while a job trains.
//
//   step 1200/4688  loss 0.4123  9,870 ex/s  elapsed 0:08  left 0:24
//
// On a terminal the line redraws in place a few times a second; otherwise
// (CI logs, files) a full line is printed every few seconds. Thread-safe:
// every worker may report its steps.
#ifndef SHOAL_SESSION_PROGRESS_H_
#define SHOAL_SESSION_PROGRESS_H_

#include <cstdio>
#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shoal {

class ProgressReporter {
 public:
  // Writes to `out` (not owned); `total_steps` global steps, `examples_per_step` each.
  ProgressReporter(std::FILE* out, int64_t total_steps, int64_t examples_per_step);

  // `auc`: the batch's, for a click model (-1: none), shown smoothed like the loss.
  void OnStep(int64_t global_step, double loss, double auc = -1);
  // Prints the final line (always) and ends the redrawn line.
  void Finish();

 private:
  void Print(int64_t global_step, double loss, bool final_line);

  std::FILE* out_;
  const int64_t total_steps_;
  const int64_t batch_size_;
  const bool redraw_;
  const absl::Duration interval_;
  const absl::Time start_;
  std::mutex mu_;
  absl::Time last_print_;
  int64_t last_step_ = 0;
  double smoothed_loss_ = -1;
  double smoothed_auc_ = -1;
};

// "1:05" or "1:02:03".
std::string FormatClock(absl::Duration d);

}  // namespace shoal

#endif  // SHOAL_SESSION_PROGRESS_H_
