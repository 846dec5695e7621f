#include "shoal/transport/route_trial.h"

namespace shoal {

RouteTrial::Choice RouteTrial::Pick(absl::Time now) {
  absl::MutexLock lock(&mu_);
  const Route other = static_cast<Route>(1 - preferred_);
  if (next_trial_ == absl::InfinitePast()) next_trial_ = now + kFirstTrialAfter;
  const double elapsed_s = absl::ToDoubleSeconds(now - phase_start_);
  Choice choice;
  switch (phase_) {
    case Phase::kSettled:
      if (now >= next_trial_) {
        phase_ = Phase::kPreferred;
        phase_start_ = now;
        phase_calls_ = 0;
      }
      break;
    case Phase::kPreferred:
      if (now - phase_start_ >= kPhase) {
        preferred_rate_ = phase_calls_ / elapsed_s;
        phase_ = Phase::kOther;
        phase_start_ = now;
        phase_calls_ = 0;
      }
      break;
    case Phase::kOther:
      if (now - phase_start_ >= kPhase) {
        const double other_rate = phase_calls_ / elapsed_s;
        if (other_rate >= kMoveAbove * preferred_rate_) {
          preferred_ = other;
          choice.moved = true;
          choice.rate_left = preferred_rate_;
          choice.rate_taken = other_rate;
        }
        phase_ = Phase::kSettled;
        next_trial_ = now + kTrialEvery;
      }
      break;
  }
  if (phase_ != Phase::kSettled) ++phase_calls_;
  choice.route = phase_ == Phase::kOther ? static_cast<Route>(1 - preferred_) : preferred_;
  return choice;
}

RouteTrial::Route RouteTrial::preferred() const {
  absl::MutexLock lock(&mu_);
  return preferred_;
}

}  // namespace shoal
