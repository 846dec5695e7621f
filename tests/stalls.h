// A worker that stalls now and then, as a SIGSTOPped process would: for the
// tests of leased data, whose leases run out under a stalled holder.
#ifndef SHOAL_TESTS_STALLS_H_
#define SHOAL_TESTS_STALLS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "shoal/strategy/leased_data.h"
#include "shoal/strategy/strategy.h"

namespace shoal {

// Worker `worker` sleeps `pause` before each local step s with s % every ==
// at, at most `most` times. Customizer() is TrainInProcess's customizer.
struct Stalls {
  int worker = 0;
  int64_t every = 1;
  int64_t at = 0;
  int most = 0;
  absl::Duration pause;
  std::atomic<int> count{0};            // stalls so far
  std::shared_ptr<LeasedData> leased;  // the stalled worker's, kept past the job

  std::function<void(WorkerContext&)> Customizer() {
    return [this](WorkerContext& context) {
      if (context.worker_index != worker) return;
      context.before_step = [this, &context](int64_t step) {
        leased = context.leased_data;
        if (step % every == at && count < most) {
          ++count;
          absl::SleepFor(pause);
        }
      };
    };
  }
};

}  // namespace shoal

#endif  // SHOAL_TESTS_STALLS_H_
