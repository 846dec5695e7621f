#include "shoal/transport/blocking_executor.h"

#include <pthread.h>

#include <thread>

#include "absl/time/time.h"

namespace shoal {
namespace {
// An idle thread leaves after this long, so a burst of polls does not keep
// its threads for the life of the process.
constexpr absl::Duration kIdleThreadLifetime = absl::Seconds(10);
}  // namespace

BlockingExecutor::BlockingExecutor(int max_threads, int max_pending)
    : state_(std::make_shared<State>()), max_threads_(std::max(1, max_threads)), max_pending_(std::max(1, max_pending)) {}

BlockingExecutor::~BlockingExecutor() {
  absl::MutexLock lock(&state_->mu);
  state_->stopping = true;
  state_->mu.Await(absl::Condition(
      +[](State* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->threads == 0; }, state_.get()));
}

bool BlockingExecutor::TrySubmit(std::function<void()> task) {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  if (s.stopping || s.pending >= max_pending_) return false;
  ++s.pending;
  s.queue.push_back(std::move(task));
  if (static_cast<int>(s.queue.size()) > s.idle && s.threads < max_threads_) {
    ++s.threads;
    // The thread keeps the state alive: it may still be leaving its lock
    // when the executor, which waited for it, is gone.
    std::thread([state = state_] { Work(*state); }).detach();
  }
  return true;
}

void BlockingExecutor::Work(State& s) {
  pthread_setname_np(pthread_self(), "shoal blocking");
  absl::MutexLock lock(&s.mu);
  while (true) {
    ++s.idle;
    const bool woke = s.mu.AwaitWithTimeout(
        absl::Condition(+[](State* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return !s->queue.empty() || s->stopping; }, &s),
        kIdleThreadLifetime);
    --s.idle;
    if (s.queue.empty()) {
      if (!woke || s.stopping) break;
      continue;
    }
    std::function<void()> task = std::move(s.queue.front());
    s.queue.pop_front();
    s.mu.Unlock();
    task();
    task = nullptr;  // its captures go before the count says it is done
    s.mu.Lock();
    --s.pending;
  }
  --s.threads;
}

std::shared_ptr<BlockingExecutor> BlockingExecutor::Shared() {
  static auto* shared = new std::shared_ptr<BlockingExecutor>(std::make_shared<BlockingExecutor>(64, 256));
  return *shared;
}

}  // namespace shoal
