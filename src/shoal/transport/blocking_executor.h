// BlockingExecutor: where a server runs requests that may wait (long polls
// on counters and accumulators) or take long (checkpoint saves and
// restores), so that they never hold a transport's own threads, which serve
// the very calls that end their wait, and the pushes a save would stall.
//
// Bounded twice: at most `max_threads` threads (started on demand, leaving
// after a while idle), and at most `max_pending` tasks queued or running; a
// task beyond that is refused (TrySubmit returns false) and its caller
// answers RESOURCE_EXHAUSTED, so that a flood of polls cannot exhaust the
// process's threads or memory. Thread-safe; shared by every transport of a
// process (Shared()).
#ifndef SHOAL_TRANSPORT_BLOCKING_EXECUTOR_H_
#define SHOAL_TRANSPORT_BLOCKING_EXECUTOR_H_

#include <deque>
#include <functional>
#include <memory>

#include "absl/synchronization/mutex.h"

namespace shoal {

class BlockingExecutor {
 public:
  BlockingExecutor(int max_threads, int max_pending);
  // Waits for the queued and running tasks.
  ~BlockingExecutor();

  // Queues `task`, or returns false when `max_pending` are queued or running.
  bool TrySubmit(std::function<void()> task);

  int max_pending() const { return max_pending_; }

  // The process's executor (64 threads, 256 pending), never destroyed.
  static std::shared_ptr<BlockingExecutor> Shared();

 private:
  struct State {
    absl::Mutex mu;
    std::deque<std::function<void()>> queue ABSL_GUARDED_BY(mu);
    int threads ABSL_GUARDED_BY(mu) = 0;
    int idle ABSL_GUARDED_BY(mu) = 0;
    int pending ABSL_GUARDED_BY(mu) = 0;  // queued + running
    bool stopping ABSL_GUARDED_BY(mu) = false;
  };
  static void Work(State& state);

  std::shared_ptr<State> state_;
  const int max_threads_;
  const int max_pending_;
};

}  // namespace shoal

#endif  // SHOAL_TRANSPORT_BLOCKING_EXECUTOR_H_
