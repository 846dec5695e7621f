#include "shoal/session/progress.h"

#include <algorithm>

#include <unistd.h>

#include <string>

#include "absl/strings/str_format.h"

namespace shoal {

std::string FormatClock(absl::Duration d) {
  int64_t s = absl::ToInt64Seconds(d);
  if (s < 0) s = 0;
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

ProgressReporter::ProgressReporter(std::FILE* out, int64_t total_steps, int64_t batch_size)
    : out_(out), total_steps_(total_steps), batch_size_(batch_size), redraw_(isatty(fileno(out)) != 0),
      interval_(redraw_ ? absl::Milliseconds(200) : absl::Seconds(5)), start_(absl::Now()), last_print_(start_) {}

void ProgressReporter::OnStep(int64_t global_step, double loss, double auc) {
  std::lock_guard lock(mu_);
  smoothed_loss_ = smoothed_loss_ < 0 ? loss : 0.98 * smoothed_loss_ + 0.02 * loss;
  if (auc >= 0) smoothed_auc_ = smoothed_auc_ < 0 ? auc : 0.98 * smoothed_auc_ + 0.02 * auc;
  last_step_ = std::max(last_step_, global_step);
  if (absl::Now() - last_print_ < interval_) return;
  last_print_ = absl::Now();
  Print(last_step_, smoothed_loss_, false);
}

void ProgressReporter::Finish() {
  std::lock_guard lock(mu_);
  Print(last_step_, smoothed_loss_, true);
}

void ProgressReporter::Print(int64_t step, double loss, bool final_line) {
  const absl::Duration elapsed = absl::Now() - start_;
  const double seconds = std::max(1e-9, absl::ToDoubleSeconds(elapsed));
  const double steps_per_second = step / seconds;
  const absl::Duration left =
      steps_per_second > 0 ? absl::Seconds((total_steps_ - step) / steps_per_second) : absl::ZeroDuration();
  const std::string auc = smoothed_auc_ >= 0 ? absl::StrFormat("  auc %.4f", smoothed_auc_) : "";
  std::string line = absl::StrFormat("step %d/%d  loss %.4f%s  %.0f ex/s  elapsed %s  left %s", step, total_steps_,
                                     loss < 0 ? 0.0 : loss, auc, steps_per_second * batch_size_,
                                     FormatClock(elapsed), FormatClock(final_line ? absl::ZeroDuration() : left));
  if (redraw_) {
    // On a terminal, a bar in front, as tqdm draws it.
    constexpr int kBarWidth = 20;
    const double done = total_steps_ > 0 ? std::clamp(static_cast<double>(step) / total_steps_, 0.0, 1.0) : 0.0;
    const int filled = static_cast<int>(done * kBarWidth);
    const std::string bar = std::string(filled, '#') + std::string(kBarWidth - filled, ' ');
    absl::FPrintF(out_, "\r\033[K%3.0f%%|%s| %s%s", 100 * done, bar, line, final_line ? "\n" : "");
  } else {
    absl::FPrintF(out_, "%s\n", line);
  }
  std::fflush(out_);
}

}  // namespace shoal
