#include "shoal/transport/ucx/ucx_loop.h"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include <ucs/config/global_opts.h>

namespace shoal {

std::string UcxError(ucs_status_t status) { return ucs_status_string(status); }

absl::StatusOr<std::shared_ptr<UcxContext>> UcxContext::Create(const std::string& transports) {
  // UCX warns, as a process ends, about requests still in flight to a peer
  // that died; shoal has already reported that peer (UNAVAILABLE). Errors
  // still show; UCX_LOG_LEVEL, when set, decides.
  if (std::getenv("UCX_LOG_LEVEL") == nullptr) ucs_global_opts_set_value("LOG_LEVEL", "error");
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) return absl::InternalError("UCX: cannot read its configuration: " + UcxError(status));
  if (!transports.empty() && (status = ucp_config_modify(config, "TLS", transports.c_str())) != UCS_OK) {
    ucp_config_release(config);
    return absl::InvalidArgumentError(absl::StrCat("UCX transports '", transports, "': ", UcxError(status)));
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  // Active messages carry requests and answers; WAKEUP gives the workers
  // an event fd, so that their threads sleep instead of polling.
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  ucp_context_h context = nullptr;
  status = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (status != UCS_OK) return absl::InternalError("UCX: cannot initialise: " + UcxError(status));
  return std::shared_ptr<UcxContext>(new UcxContext(context));
}

UcxContext::~UcxContext() { ucp_cleanup(context_); }

absl::StatusOr<std::unique_ptr<UcxLoop>> UcxLoop::Create(std::shared_ptr<UcxContext> context, std::string name,
                                                          absl::Duration stay_awake) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the loop's thread touches it
  ucp_worker_h worker = nullptr;
  ucs_status_t status = ucp_worker_create(context->get(), &params, &worker);
  if (status != UCS_OK) {
    return absl::InternalError(absl::StrCat(name, ": cannot create a UCX worker: ", UcxError(status)));
  }
  std::unique_ptr<UcxLoop> loop(new UcxLoop(std::move(context), worker, std::move(name)));
  loop->stay_awake_ = stay_awake;
  if (loop->epoll_fd_ < 0 || loop->wake_fd_ < 0 || loop->worker_fd_ < 0 || loop->address_.empty()) {
    return absl::InternalError(absl::StrCat(loop->name_, ": cannot set up the UCX worker's wake-ups"));
  }
  loop->thread_ = std::thread([raw = loop.get()] { raw->Run(); });
  return loop;
}

UcxLoop::UcxLoop(std::shared_ptr<UcxContext> context, ucp_worker_h worker, std::string name)
    : context_(std::move(context)), worker_(worker), name_(std::move(name)) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (ucp_worker_get_efd(worker_, &worker_fd_) != UCS_OK) worker_fd_ = -1;
  ucp_address_t* address = nullptr;
  size_t length = 0;
  if (ucp_worker_get_address(worker_, &address, &length) == UCS_OK) {
    address_.assign(reinterpret_cast<const char*>(address), length);
    ucp_worker_release_address(worker_, address);
  }
  for (int fd : {wake_fd_, worker_fd_}) {
    if (epoll_fd_ < 0 || fd < 0) continue;
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event);
  }
}

UcxLoop::~UcxLoop() {
  Stop(nullptr);
  ucp_worker_destroy(worker_);
  if (wake_fd_ >= 0) close(wake_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

void UcxLoop::Stop(std::function<void()> before_stop) {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      posted_.push_back([this, before_stop = std::move(before_stop)] {
        if (before_stop) before_stop();
        stop_now_ = true;
      });
      has_posted_.store(true, std::memory_order_release);
      stopping_ = true;
    }
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
}

bool UcxLoop::Post(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return false;
    posted_.push_back(std::move(task));
    has_posted_.store(true, std::memory_order_seq_cst);
  }
  // An awake loop finds the task without being woken (a syscall saved per
  // message); one about to sleep re-checks has_posted_ after saying so.
  if (sleeping_.load(std::memory_order_seq_cst)) {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  return true;
}

void UcxLoop::Watch(int fd, uint32_t events, std::function<void(uint32_t)> on_ready) {
  epoll_event event{};
  event.events = events;
  event.data.fd = fd;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) == 0) watched_[fd] = std::move(on_ready);
}

void UcxLoop::Unwatch(int fd) {
  if (watched_.erase(fd) > 0) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
}

uint64_t UcxLoop::At(absl::Time when, std::function<void()> fn) {
  const uint64_t id = next_timer_++;
  timers_.emplace(std::make_pair(when, id), std::move(fn));
  timer_times_[id] = when;
  return id;
}

void UcxLoop::Cancel(uint64_t id) {
  auto it = timer_times_.find(id);
  if (it == timer_times_.end()) return;
  timers_.erase({it->second, id});
  timer_times_.erase(it);
}

bool UcxLoop::RunPosted() {
  if (!has_posted_.load(std::memory_order_acquire)) return false;
  std::vector<std::function<void()>> tasks;
  {
    absl::MutexLock lock(&mu_);
    tasks.swap(posted_);
    has_posted_.store(false, std::memory_order_relaxed);
  }
  for (auto& task : tasks) task();
  return !tasks.empty();
}

void UcxLoop::RunDueTimers() {
  const absl::Time now = absl::Now();
  while (!timers_.empty() && timers_.begin()->first.first <= now) {
    auto node = timers_.extract(timers_.begin());
    timer_times_.erase(node.key().second);
    node.mapped()();
  }
}

int UcxLoop::MillisecondsToNextTimer() const {
  if (timers_.empty()) return -1;
  const absl::Duration left = timers_.begin()->first.first - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 60000));
}

void UcxLoop::ProgressUntil(const std::function<bool()>& done, absl::Time deadline) {
  while (!done() && absl::Now() < deadline) {
    if (ucp_worker_progress(worker_) == 0) usleep(100);
  }
}

void UcxLoop::WaitForEvents(int timeout_ms) {
  epoll_event events[32];
  const int n = epoll_wait(epoll_fd_, events, 32, timeout_ms);
  for (int i = 0; i < n; ++i) {
    const int fd = events[i].data.fd;
    if (fd == wake_fd_) {
      uint64_t count;
      (void)!read(wake_fd_, &count, sizeof(count));
    } else if (fd != worker_fd_) {
      auto it = watched_.find(fd);
      if (it != watched_.end()) {
        auto on_ready = it->second;  // it may unwatch itself
        on_ready(events[i].events);
      }
    }
  }
}

void UcxLoop::Run() {
  // While awake the loop still looks at its sockets (new connections,
  // handshakes, peers gone) this often, however busy the worker keeps it.
  constexpr absl::Duration kLookAtSocketsEvery = absl::Microseconds(200);
  absl::Time sockets_seen;
  while (!stop_now_) {
    bool busy = RunPosted();
    while (!stop_now_ && ucp_worker_progress(worker_) != 0) busy = true;
    RunDueTimers();
    busy = RunPosted() || busy;  // what the progress's callbacks queued
    if (stop_now_) break;
    const absl::Time now = absl::Now();
    if (busy) last_busy_ = now;
    // Right after work an answer is likely within microseconds: staying
    // awake that long saves the wake-ups (tens of microseconds each) that
    // would otherwise dominate small calls. Idle, the loop sleeps, unless
    // the worker will not arm: it says events are pending (UCS_ERR_BUSY).
    // It also says so, with nothing to progress, once a peer on shared
    // memory died with sends queued to it (UCX 1.13 cannot cancel those;
    // README, "The data plane"). The loop then stays awake, and must still
    // look at its sockets: the liveness socket is what reports that peer.
    const bool awake = busy || now - last_busy_ < stay_awake_;
    if (!awake && ucp_worker_arm(worker_) != UCS_ERR_BUSY) {
      sleeping_.store(true, std::memory_order_seq_cst);
      if (!has_posted_.load(std::memory_order_seq_cst)) WaitForEvents(MillisecondsToNextTimer());
      sleeping_.store(false, std::memory_order_relaxed);
      sockets_seen = absl::Now();
      continue;
    }
    if (now - sockets_seen >= kLookAtSocketsEvery) {
      sockets_seen = now;
      WaitForEvents(0);
    }
    // Let a thread that has work (a worker's compute) have the core.
    if (!busy) sched_yield();
  }
}

}  // namespace shoal
