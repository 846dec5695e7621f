#include "shoal/transport/ucx/ucx_loop.h"

#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
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
  // Every connection has a worker of its own (see the header), and UCX's
  // shared-memory transports give each worker 512 receive buffers of 8 KiB
  // up front (4.2 MB of /dev/shm and resident memory a worker, measured);
  // 64 at first, grown on demand, make it 1.1 MB. The environment decides
  // when it sets UCX_MM_RX_BUFS_GROW.
  if (std::getenv("UCX_MM_RX_BUFS_GROW") == nullptr) ucp_config_modify(config, "MM_RX_BUFS_GROW", "64");
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

UcxContext::~UcxContext() {
  if (!worker_abandoned_) ucp_cleanup(context_);
}

absl::StatusOr<std::unique_ptr<UcxLoop>> UcxLoop::Create(std::shared_ptr<UcxContext> context, std::string name,
                                                          absl::Duration stay_awake, std::function<void()> yield) {
  std::unique_ptr<UcxLoop> loop(new UcxLoop(std::move(context), std::move(name)));
  loop->stay_awake_ = stay_awake;
  loop->yield_ = yield != nullptr ? std::move(yield) : [] { sched_yield(); };
  if (loop->epoll_fd_ < 0 || loop->wake_fd_ < 0) {
    return absl::InternalError(absl::StrCat(loop->name_, ": cannot set up the UCX loop's wake-ups"));
  }
  loop->thread_ = std::thread([raw = loop.get()] { raw->Run(); });
  return loop;
}

UcxLoop::UcxLoop(std::shared_ptr<UcxContext> context, std::string name)
    : context_(std::move(context)), name_(std::move(name)) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ >= 0 && wake_fd_ >= 0) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = wake_fd_;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &event);
  }
}

UcxLoop::~UcxLoop() {
  Stop(nullptr);
  for (auto* list : {&workers_, &retired_}) {
    for (auto& worker : *list) {
      if (!DestroyIfIdle(worker.get())) worker.release();  // UCX would abort: leave it (and the context)
    }
    list->clear();
  }
  for (auto& worker : abandoned_) worker.release();
  if (wake_fd_ >= 0) close(wake_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

void UcxWorker::OnMessage(unsigned id, MessageHandler handler) {
  handlers_[id] = std::move(handler);
  ucp_am_handler_param_t param{};
  param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  param.id = id;
  param.arg = &handlers_[id];  // a map's values stay where they are
  param.cb = [](void* arg, const void* header, size_t header_length, void* data, size_t length,
                const ucp_am_recv_param_t* recv) {
    (*static_cast<MessageHandler*>(arg))(header, header_length, data, length, recv);
    return UCS_OK;
  };
  ucp_worker_set_am_recv_handler(worker_, &param);
}

absl::StatusOr<UcxWorker*> UcxLoop::AddWorker() {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the loop's thread touches it
  std::unique_ptr<UcxWorker> worker(new UcxWorker());
  ucs_status_t status = ucp_worker_create(context_->get(), &params, &worker->worker_);
  if (status != UCS_OK) {
    // Unavailable, so that the connection is tried again within the call's
    // deadline: under load UCX has failed here once ("No such device") for a
    // restarted worker's connection, which then ended the job.
    return absl::UnavailableError(absl::StrCat(name_, ": cannot create a UCX worker: ", UcxError(status)));
  }
  ucp_address_t* address = nullptr;
  size_t length = 0;
  if (ucp_worker_get_efd(worker->worker_, &worker->event_fd_) != UCS_OK ||
      ucp_worker_get_address(worker->worker_, &address, &length) != UCS_OK) {
    ucp_worker_destroy(worker->worker_);
    return absl::InternalError(absl::StrCat(name_, ": cannot set up a UCX worker's wake-ups"));
  }
  worker->address_.assign(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(worker->worker_, address);
  ucp_worker_attr_t attributes{};
  attributes.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  if (ucp_worker_query(worker->worker_, &attributes) == UCS_OK) worker->max_am_header_ = attributes.max_am_header;
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.fd = worker->event_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, worker->event_fd_, &event);
  workers_.push_back(std::move(worker));
  return workers_.back().get();
}

void UcxLoop::RemoveWorker(UcxWorker* worker) {
  for (auto it = workers_.begin(); it != workers_.end(); ++it) {
    if (it->get() != worker) continue;
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, worker->event_fd_, nullptr);
    worker->retired_at_ = absl::Now();
    retired_.push_back(std::move(*it));
    workers_.erase(it);
    return;
  }
}

bool UcxLoop::DestroyIfIdle(UcxWorker* worker) {
  if (worker->requests_in_flight_ > 0) {
    context_->WorkerAbandoned();
    return false;
  }
  // Destroys the worker's endpoints too.
  ucp_worker_destroy(worker->worker_);
  worker->worker_ = nullptr;
  return true;
}

void UcxLoop::TendRetiredWorkers() {
  // A retired worker is drained this often, so that requests to a live
  // peer finish; one whose requests are still in flight after
  // kGiveUpAfter had a peer that died holding them, and is abandoned.
  constexpr absl::Duration kDrainEvery = absl::Milliseconds(20);
  constexpr absl::Duration kGiveUpAfter = absl::Seconds(10);
  if (retired_.empty()) return;
  const absl::Time now = absl::Now();
  const bool drain = now - retired_tended_ >= kDrainEvery;
  if (drain) retired_tended_ = now;
  for (size_t i = 0; i < retired_.size();) {
    UcxWorker* worker = retired_[i].get();
    if (worker->requests_in_flight_ > 0 && drain && now - worker->retired_at_ < kGiveUpAfter) {
      ucp_worker_progress(worker->worker_);  // its callbacks may retire more (appended)
    }
    if (worker->requests_in_flight_ == 0) {
      DestroyIfIdle(worker);
    } else if (now - worker->retired_at_ >= kGiveUpAfter) {
      context_->WorkerAbandoned();
      abandoned_.push_back(std::move(retired_[i]));
    } else {
      ++i;
      continue;
    }
    retired_.erase(retired_.begin() + i);
  }
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
  // Retired workers still draining wake the loop every 20 ms (at most 10 s).
  const int cap = retired_.empty() ? 60000 : 20;
  if (timers_.empty()) return retired_.empty() ? -1 : cap;
  const absl::Duration left = timers_.begin()->first.first - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), cap));
}

bool UcxLoop::ProgressWorkers() {
  bool any = false;
  // By index: a callback may add a worker or retire one (moved to retired_,
  // whose requests it then no longer progresses here).
  for (size_t i = 0; i < workers_.size(); ++i) {
    ucp_worker_h worker = workers_[i]->worker_;  // retired meanwhile, it still lives until tended
    while (ucp_worker_progress(worker) != 0) any = true;
  }
  return any;
}

bool UcxLoop::ArmWorkers() {
  for (auto& worker : workers_) {
    if (ucp_worker_arm(worker->worker_) == UCS_ERR_BUSY) return false;
  }
  return true;
}

void UcxLoop::ProgressUntil(const std::function<bool()>& done, absl::Time deadline) {
  while (!done() && absl::Now() < deadline) {
    if (!ProgressWorkers()) usleep(100);
  }
}

namespace {

// A yield that keeps the loop from its core this long ran another thread's
// time slice (a worker's step takes about 1 ms here; a CPU hog's slice is
// several), and this many such yields within kContendedWindow mean the
// core is contended. Measured on 2 cores, the main job as processes: idle,
// a handful in 5 s of training; beside 2 busy processes, every few ms.
constexpr absl::Duration kLongYield = absl::Milliseconds(2);
constexpr absl::Duration kContendedWindow = absl::Milliseconds(100);

}  // namespace

bool UcxLoop::contended() const {
  const absl::Time oldest = *std::min_element(std::begin(long_yields_), std::end(long_yields_));
  return absl::Now() - oldest < kContendedWindow;
}

void UcxLoop::WaitForEvents(int timeout_ms) {
  epoll_event events[32];
  const int n = epoll_wait(epoll_fd_, events, 32, timeout_ms);
  for (int i = 0; i < n; ++i) {
    const int fd = events[i].data.fd;
    if (fd == wake_fd_) {
      uint64_t count;
      (void)!read(wake_fd_, &count, sizeof(count));
    } else {
      auto it = watched_.find(fd);
      if (it != watched_.end()) {  // (not a worker's event fd: progress serves those)
        auto on_ready = it->second;  // it may unwatch itself
        on_ready(events[i].events);
      }
    }
  }
}

namespace {

// The loop thread's name, as top and perf show it: "/job:ps/task:0" gives
// "ucx ps:0" (a name holds at most 15 characters).
std::string LoopThreadName(const std::string& loop_name) {
  std::string name = absl::StrCat(
      "ucx ", absl::StrReplaceAll(loop_name, {{"/job:", ""}, {"/task:", ":"}, {"UCX ", ""}}));
  name.resize(std::min<size_t>(name.size(), 15));
  return name;
}

}  // namespace

void UcxLoop::Run() {
  pthread_setname_np(pthread_self(), LoopThreadName(name_).c_str());
  // While awake the loop still looks at its sockets (new connections,
  // handshakes, peers gone) this often, however busy the worker keeps it.
  constexpr absl::Duration kLookAtSocketsEvery = absl::Microseconds(200);
  absl::Time sockets_seen;
  while (!stop_now_) {
    TendRetiredWorkers();
    bool busy = RunPosted();
    busy = ProgressWorkers() || busy;
    RunDueTimers();
    busy = RunPosted() || busy;  // what the progress's callbacks queued
    if (stop_now_) break;
    const absl::Time now = absl::Now();
    if (busy) last_busy_ = now;
    // Right after work an answer is likely within microseconds: staying
    // awake that long saves the wake-ups (tens of microseconds each) that
    // would otherwise dominate small calls. Idle, the loop sleeps, unless
    // a worker will not arm: it says events are pending (UCS_ERR_BUSY).
    // One also says so, with nothing to progress, once a peer on shared
    // memory died with sends queued to it (UCX 1.13 cannot cancel those).
    // The loop then stays awake, and must still look at its sockets: the
    // liveness socket reports that peer, and its worker is then removed.
    // While the core is contended it does not stay awake after work (see
    // the header); it then no longer yields either, so that after
    // kContendedWindow it stays awake again and finds out afresh.
    const bool awake = busy || (now - last_busy_ < stay_awake_ && !contended());
    if (!awake && ArmWorkers()) {
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
    if (!busy) {
      const absl::Time before = absl::Now();
      yield_();
      const absl::Time after = absl::Now();
      if (after - before > kLongYield) long_yields_[long_yields_seen_++ % std::size(long_yields_)] = after;
    }
  }
}

}  // namespace shoal
