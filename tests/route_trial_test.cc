#include "shoal/transport/route_trial.h"

#include <gtest/gtest.h>

#include <vector>

namespace shoal {
namespace {

// Calls made back to back for `span`, each taking `fast` or `control` by
// the route it was given, starting at `*now` (advanced); returns how many
// took the control route. Moves are added to `*moves` when given.
int CallFor(RouteTrial& trial, absl::Time* now, absl::Duration span, absl::Duration fast, absl::Duration control,
            std::vector<RouteTrial::Choice>* moves = nullptr) {
  const absl::Time end = *now + span;
  int over_control = 0;
  while (*now < end) {
    const RouteTrial::Choice choice = trial.Pick(*now);
    if (choice.moved && moves != nullptr) moves->push_back(choice);
    const RouteTrial::Route route = choice.route;
    over_control += route == RouteTrial::kControl;
    *now += route == RouteTrial::kFast ? fast : control;
  }
  return over_control;
}

TEST(RouteTrialTest, StaysOnTheFastRouteWhileItCarriesMoreCallsAndTriesTheOtherNowAndThen) {
  RouteTrial trial;
  absl::Time now = absl::FromUnixSeconds(1000);
  const absl::Duration fast = absl::Microseconds(600), control = absl::Microseconds(1000);
  // Until the first trial, every call goes over the fast route.
  EXPECT_EQ(CallFor(trial, &now, RouteTrial::kFirstTrialAfter, fast, control), 0);
  // A trial: kPhase of calls over each route; the control route's carried fewer.
  EXPECT_GT(CallFor(trial, &now, 2 * RouteTrial::kPhase + absl::Milliseconds(5), fast, control), 0);
  EXPECT_EQ(trial.preferred(), RouteTrial::kFast);
  // Then nothing over the control route until the next trial.
  EXPECT_EQ(CallFor(trial, &now, RouteTrial::kTrialEvery - absl::Milliseconds(50), fast, control), 0);
}

TEST(RouteTrialTest, MovesToTheRouteThatCarriedMoreCallsAndBackWhenItNoLongerDoes) {
  RouteTrial trial;
  absl::Time now = absl::FromUnixSeconds(1000);
  // As beside busy processes: gRPC carries 2.5x the calls.
  std::vector<RouteTrial::Choice> moves;
  CallFor(trial, &now, RouteTrial::kFirstTrialAfter + 2 * RouteTrial::kPhase + absl::Milliseconds(5),
          absl::Microseconds(2500), absl::Microseconds(1000), &moves);
  EXPECT_EQ(trial.preferred(), RouteTrial::kControl);
  // The move is reported once, with each route's calls a second.
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].route, RouteTrial::kControl);
  EXPECT_NEAR(moves[0].rate_left, 400, 5);
  EXPECT_NEAR(moves[0].rate_taken, 1000, 5);
  const int over_control = CallFor(trial, &now, absl::Seconds(5), absl::Microseconds(2500), absl::Microseconds(1000));
  EXPECT_EQ(over_control, 5000) << "every call over the control route until the next trial";
  // The load gone: the next trial finds the fast route carrying 1.6x.
  CallFor(trial, &now, RouteTrial::kTrialEvery, absl::Microseconds(600), absl::Microseconds(1000));
  EXPECT_EQ(trial.preferred(), RouteTrial::kFast);
}

TEST(RouteTrialTest, ADifferenceUnderAQuarterMovesNothing) {
  RouteTrial trial;
  absl::Time now = absl::FromUnixSeconds(1000);
  CallFor(trial, &now, absl::Seconds(30), absl::Microseconds(1100), absl::Microseconds(1000));
  EXPECT_EQ(trial.preferred(), RouteTrial::kFast);
}

TEST(RouteTrialTest, RareCallsMoveNothing) {
  // One call every 2 s: each phase sees one call over each route.
  RouteTrial trial;
  absl::Time now = absl::FromUnixSeconds(1000);
  CallFor(trial, &now, absl::Seconds(60), absl::Seconds(2), absl::Seconds(2));
  EXPECT_EQ(trial.preferred(), RouteTrial::kFast);
}

}  // namespace
}  // namespace shoal
