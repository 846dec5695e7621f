// RouteTrial: which of a channel's two routes to a task (UCX or gRPC) its
// calls take, chosen by trying the other one now and then.
//
// On an idle machine UCX's shared memory carries the main job about 1.6x
// faster than gRPC; beside processes that keep every core busy, gRPC's
// kernel sockets carry it up to 2.6x faster (a 1 MB message crosses UCX's
// small shared-memory FIFO a slice at a time, and the receiver must win the
// CPU for each). Neither the calls' latencies (UCX's edge is the CPU it
// leaves to compute, not a sooner answer) nor the loops' contention flags
// told the two apart, so the trial measures what a caller feels: calls a
// second. Every kTrialEvery it counts the calls of kPhase on the preferred
// route, then of kPhase on the other, and moves to the other when that
// phase saw at least kMoveAbove as many calls.
//
// Not thread-safe: a channel calls it under its own lock. The clock is
// passed in, for tests.
#ifndef SHOAL_TRANSPORT_ROUTE_TRIAL_H_
#define SHOAL_TRANSPORT_ROUTE_TRIAL_H_

#include <cstdint>

#include "absl/time/time.h"

namespace shoal {

class RouteTrial {
 public:
  enum Route { kFast = 0, kControl = 1 };

  static constexpr absl::Duration kFirstTrialAfter = absl::Seconds(1);
  static constexpr absl::Duration kTrialEvery = absl::Seconds(10);
  static constexpr absl::Duration kPhase = absl::Milliseconds(250);
  static constexpr double kMoveAbove = 1.25;

  struct Choice {
    Route route = kFast;  // for the call
    // Set when this call ended a trial that moved the channel to `route`:
    // calls a second over the route left and over `route`.
    bool moved = false;
    double rate_left = 0, rate_taken = 0;
  };

  // The route for a call made at `now`.
  Choice Pick(absl::Time now);

  Route preferred() const { return preferred_; }

 private:
  enum class Phase { kSettled, kPreferred, kOther };

  static Route Other(Route route) { return route == kFast ? kControl : kFast; }
  void Begin(Phase phase, absl::Time now);

  Route preferred_ = kFast;
  Phase phase_ = Phase::kSettled;
  absl::Time next_trial_ = absl::InfinitePast();  // set by the first call
  absl::Time phase_start_;
  int64_t phase_calls_ = 0;    // calls since phase_start_
  double preferred_rate_ = 0;  // calls a second in the last kPreferred phase
};

}  // namespace shoal

#endif  // SHOAL_TRANSPORT_ROUTE_TRIAL_H_
