// UcxLoop: a thread that drives UCX workers, asleep when idle.
//
// A loop holds one UCX worker per connection (UcxWorker), so that a peer's
// death takes only its own worker with it: UCX 1.13 cannot cancel sends
// queued on a shared-memory endpoint to a dead peer, and a worker holding
// such sends reports pending work for ever (it would keep the loop polling
// and could stall new connections made through it). A connection that ends
// retires its worker: the loop stops sleeping on it, drains it now and then
// until the requests shoal started on it are done, then destroys it (UCX
// aborts the process if a worker is destroyed with a rendezvous request in
// flight). One whose requests never finish (its peer died holding them) is
// left alone after a while: its memory stays until the process ends.
//
// Every UCX call on a worker happens on the loop's thread (the workers are
// single-threaded, so UCX takes no locks); other threads hand work over
// with Post(). The thread sleeps in epoll_wait on the workers' event fds
// (after ucp_worker_arm), on an eventfd that Post() writes, on the sockets
// it was told to Watch(), and until the earliest timer (At()). It polls
// only for a moment (`stay_awake`, microseconds) after it has worked, when
// an answer is likely: an idle loop uses no CPU.
//
// While other threads keep its thread from the core (contended(): a CPU
// hog, another job, a build beside the task), the loop sleeps as soon as
// it is idle, for a thread that yields waits behind whole time slices of
// the others, where one woken from epoll_wait runs at once.
//
// Also the loop thread only: AddWorker/RemoveWorker, Watch/Unwatch,
// At/Cancel.
#ifndef SHOAL_TRANSPORT_UCX_UCX_LOOP_H_
#define SHOAL_TRANSPORT_UCX_UCX_LOOP_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shoal {

// A UCX context: the library's state for one transport (active messages,
// wake-ups). Its loops' workers must be destroyed first.
class UcxContext {
 public:
  // `transports`: UCX's transport list (UCX_TLS), empty for UCX's choice.
  static absl::StatusOr<std::shared_ptr<UcxContext>> Create(const std::string& transports);
  ~UcxContext();
  ucp_context_h get() const { return context_; }
  // A worker of this context is left undestroyed (see UcxLoop): the
  // context must then stay too.
  void WorkerAbandoned() { worker_abandoned_ = true; }

 private:
  explicit UcxContext(ucp_context_h context) : context_(context) {}
  ucp_context_h context_;
  std::atomic<bool> worker_abandoned_{false};
};

// One UCX worker of a loop, and the handlers of its active messages.
class UcxWorker {
 public:
  // Header, header length, data, data length and UCX's receive parameters
  // of one active message; the data is valid only during the call unless
  // fetched.
  using MessageHandler = std::function<void(const void*, size_t, void*, size_t, const ucp_am_recv_param_t*)>;

  ucp_worker_h get() const { return worker_; }
  // This worker's address (bytes a peer's ucp_ep_create takes).
  const std::string& address() const { return address_; }
  // The longest header an active message from this worker may have.
  size_t max_am_header() const { return max_am_header_; }
  // Routes active messages `id` to `handler`.
  void OnMessage(unsigned id, MessageHandler handler);
  // A UCX request shoal started on this worker (a send, a fetch) is in
  // flight / has completed. The worker is destroyed only with none.
  void RequestStarted() { ++requests_in_flight_; }
  void RequestEnded() { --requests_in_flight_; }

 private:
  friend class UcxLoop;
  UcxWorker() = default;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  std::string address_;
  size_t max_am_header_ = 0;
  std::map<unsigned, MessageHandler> handlers_;
  size_t requests_in_flight_ = 0;
  absl::Time retired_at_;
};

class UcxLoop {
 public:
  // Starts the thread. `name` appears in errors. After any work the thread
  // keeps progressing for `stay_awake` before it sleeps (0: sleeps at once),
  // giving its core away between polls with `yield` (sched_yield unless a
  // test passes another).
  static absl::StatusOr<std::unique_ptr<UcxLoop>> Create(std::shared_ptr<UcxContext> context, std::string name,
                                                         absl::Duration stay_awake,
                                                         std::function<void()> yield = nullptr);
  // Runs `before_stop` on the loop thread (closing endpoints), then stops
  // and joins the thread and destroys the workers. Not from the loop thread.
  ~UcxLoop();
  void Stop(std::function<void()> before_stop);

  // Runs `task` on the loop thread soon. Thread-safe. After Stop, `task` is
  // dropped and Post returns false.
  bool Post(std::function<void()> task);
  bool InLoopThread() const { return std::this_thread::get_id() == thread_.get_id(); }
  // Whether other threads have lately kept this loop's thread from its
  // core (see above). Loop thread only.
  bool contended() const;

  // A new worker, progressed by this loop until RemoveWorker.
  absl::StatusOr<UcxWorker*> AddWorker();
  // Retires `worker` (its connection ended): see above. Its endpoints go
  // with it; its handlers may still see messages while it drains.
  void RemoveWorker(UcxWorker* worker);

  // Calls `on_ready(events)` when `fd` has any of `events` (EPOLLIN...).
  void Watch(int fd, uint32_t events, std::function<void(uint32_t)> on_ready);
  void Unwatch(int fd);
  // Calls `fn` at `when` (or soon after); Cancel(id) before that stops it.
  uint64_t At(absl::Time when, std::function<void()> fn);
  void Cancel(uint64_t id);

  // Progresses the workers until `done`, or `deadline` (used while closing
  // endpoints).
  void ProgressUntil(const std::function<bool()>& done, absl::Time deadline);

 private:
  UcxLoop(std::shared_ptr<UcxContext> context, std::string name);
  void Run();
  bool ProgressWorkers();  // whether any had work
  bool ArmWorkers();       // false: one has events pending (it must be progressed, not slept on)
  // Drains retired workers (at most every kDrainEvery), destroys those with
  // no request in flight, and gives up on those retired too long ago.
  void TendRetiredWorkers();
  // Destroys `worker` if no request of shoal's is in flight on it; false
  // (and it is left as it is, leaked) otherwise.
  bool DestroyIfIdle(UcxWorker* worker);
  // Waits up to `timeout_ms` (0: not at all) for fds, and serves them.
  void WaitForEvents(int timeout_ms);
  bool RunPosted();  // whether there was any
  void RunDueTimers();
  int MillisecondsToNextTimer() const;

  std::shared_ptr<UcxContext> context_;
  std::string name_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: Post() wakes the thread

  absl::Mutex mu_;
  std::vector<std::function<void()>> posted_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // Loop thread only.
  std::vector<std::unique_ptr<UcxWorker>> workers_;
  std::vector<std::unique_ptr<UcxWorker>> retired_;    // draining
  std::vector<std::unique_ptr<UcxWorker>> abandoned_;  // requests that never finished: never touched again
  absl::Time retired_tended_;
  std::map<int, std::function<void(uint32_t)>> watched_;
  std::map<std::pair<absl::Time, uint64_t>, std::function<void()>> timers_;
  std::map<uint64_t, absl::Time> timer_times_;
  uint64_t next_timer_ = 1;
  bool stop_now_ = false;
  absl::Time last_busy_;
  absl::Duration stay_awake_;
  std::function<void()> yield_;
  // When the last few yields that gave the core away for long came back
  // (a ring, the oldest overwritten).
  absl::Time long_yields_[3] = {absl::InfinitePast(), absl::InfinitePast(), absl::InfinitePast()};
  size_t long_yields_seen_ = 0;
  std::atomic<bool> has_posted_{false};
  std::atomic<bool> sleeping_{false};  // in (or about to enter) epoll_wait

  std::thread thread_;
};

// A UCX status as text, for errors.
std::string UcxError(ucs_status_t status);

}  // namespace shoal

#endif  // SHOAL_TRANSPORT_UCX_UCX_LOOP_H_
