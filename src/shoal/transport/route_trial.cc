#include "shoal/transport/route_trial.h"

namespace shoal {

RouteTrial::Choice RouteTrial::Pick(absl::Time now) {
  if (next_trial_ == absl::InfinitePast()) next_trial_ = now + kFirstTrialAfter;
  const bool phase_over = now - phase_start_ >= kPhase;
  const double phase_rate = phase_over ? phase_calls_ / absl::ToDoubleSeconds(now - phase_start_) : 0;
  Choice choice;
  if (phase_ == Phase::kSettled && now >= next_trial_) {
    Begin(Phase::kPreferred, now);
  } else if (phase_ == Phase::kPreferred && phase_over) {
    preferred_rate_ = phase_rate;
    Begin(Phase::kOther, now);
  } else if (phase_ == Phase::kOther && phase_over) {
    if (phase_rate >= kMoveAbove * preferred_rate_) {
      preferred_ = Other(preferred_);
      choice.moved = true;
      choice.rate_left = preferred_rate_;
      choice.rate_taken = phase_rate;
    }
    phase_ = Phase::kSettled;
    next_trial_ = now + kTrialEvery;
  }
  if (phase_ != Phase::kSettled) ++phase_calls_;
  choice.route = phase_ == Phase::kOther ? Other(preferred_) : preferred_;
  return choice;
}

void RouteTrial::Begin(Phase phase, absl::Time now) {
  phase_ = phase;
  phase_start_ = now;
  phase_calls_ = 0;
}

}  // namespace shoal
