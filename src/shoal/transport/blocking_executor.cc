#include "shoal/transport/blocking_executor.h"

#include <thread>

#include "absl/time/time.h"

namespace shoal {
namespace {
// An idle thread leaves after this long, so a burst of polls does not keep
// its threads for the life of the process.
constexpr absl::Duration kIdleThreadLifetime = absl::Seconds(10);
}  // namespace

BlockingExecutor::BlockingExecutor(int max_threads, int max_pending)
    : max_threads_(std::max(1, max_threads)), max_pending_(std::max(1, max_pending)) {}

BlockingExecutor::~BlockingExecutor() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  mu_.Await(absl::Condition(
      +[](int* threads) { return *threads == 0; }, &threads_));
}

bool BlockingExecutor::TrySubmit(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || pending_ >= max_pending_) return false;
  ++pending_;
  queue_.push_back(std::move(task));
  if (static_cast<int>(queue_.size()) > idle_ && threads_ < max_threads_) {
    ++threads_;
    std::thread([this] { Work(); }).detach();
  }
  return true;
}

void BlockingExecutor::Work() {
  absl::MutexLock lock(&mu_);
  while (true) {
    ++idle_;
    const bool woke = mu_.AwaitWithTimeout(
        absl::Condition(+[](BlockingExecutor* e) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return !e->queue_.empty() || e->stopping_;
        }, this),
        kIdleThreadLifetime);
    --idle_;
    if (queue_.empty()) {
      if (!woke || stopping_) break;
      continue;
    }
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    task();
    task = nullptr;  // its captures go before the count says it is done
    mu_.Lock();
    --pending_;
  }
  --threads_;
}

std::shared_ptr<BlockingExecutor> BlockingExecutor::Shared() {
  static auto* shared = new std::shared_ptr<BlockingExecutor>(std::make_shared<BlockingExecutor>(64, 256));
  return *shared;
}

}  // namespace shoal
