#include "shoal/transport/fast_path_transport.h"

#include <deque>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "shoal/core/status.h"
#include "shoal/transport/route_trial.h"

namespace shoal {
namespace {

// "host:port" -> "host" (brackets of an IPv6 host kept).
std::string HostPart(const std::string& address) { return address.substr(0, address.rfind(':')); }

// Both servers; the fast one stops first.
class FastPathServer final : public ServerHandle {
 public:
  FastPathServer(std::unique_ptr<ServerHandle> control, std::unique_ptr<ServerHandle> fast)
      : control_(std::move(control)), fast_(std::move(fast)) {}
  ~FastPathServer() override { fast_.reset(); }
  std::string address() const override { return control_->address(); }

 private:
  std::unique_ptr<ServerHandle> control_;
  std::unique_ptr<ServerHandle> fast_;
};

// How long a channel whose task's fast endpoint could not be reached calls
// it over gRPC before it tries the fast endpoint again.
constexpr absl::Duration kFallBackFor = absl::Seconds(60);

class FastPathChannel final : public Channel, public std::enable_shared_from_this<FastPathChannel> {
 public:
  FastPathChannel(TaskId task, std::string address, std::shared_ptr<Channel> control, Transport* fast,
                  std::string fast_kind, bool try_routes)
      : Channel(std::move(task)), host_(HostPart(address)), control_(std::move(control)), fast_(fast),
        fast_kind_(std::move(fast_kind)), try_routes_(try_routes) {}

  void Call(const Request& request, Response* response, absl::Time deadline,
            std::function<void(absl::Status)> done) override {
    std::shared_ptr<Channel> route;
    std::shared_ptr<const Request> resend;
    bool ask = false;
    RouteTrial::Choice choice{RouteTrial::kFast};
    {
      absl::MutexLock lock(&mu_);
      if (route_ == control_ && absl::Now() >= fall_back_until_) route_ = nullptr;  // time to try the fast path again
      if (route_ != nullptr) {
        route = route_;
        // Until the fast route has carried a call, its calls keep a copy of
        // the request, to be sent over gRPC if it cannot be reached.
        if (route != control_ && !route_proven_) resend = std::make_shared<Request>(request);
        // Once it has, calls may try gRPC (long polls, which answer when
        // something else happens, stay where they are).
        if (try_routes_ && route != control_ && route_proven_ && !VariableService::MayWait(request)) {
          choice = trial_.Pick(absl::Now());
          if (choice.route == RouteTrial::kControl) route = control_;
        }
      } else {
        // Wait for the task to say where it serves; the request's tensors
        // are kept by reference, as a transport's Call may.
        waiting_.push_back(std::make_shared<Waiting>(Waiting{request, response, deadline, std::move(done)}));
        ask = !asking_;
        asking_ = true;
      }
    }
    if (choice.moved) SayMoved(choice);
    if (route != nullptr) {
      Send(route, request, response, deadline, std::move(done), std::move(resend));
    } else if (ask) {
      Ask(deadline);
    }
  }

 private:
  struct Waiting {
    Request request;
    Response* response;
    absl::Time deadline;
    std::function<void(absl::Status)> done;
  };

  // `resend` (or null): a copy of the request, to send again over gRPC
  // should `route` turn out to be a fast route that cannot be reached.
  void Send(const std::shared_ptr<Channel>& route, const Request& request, Response* response, absl::Time deadline,
            std::function<void(absl::Status)> done, std::shared_ptr<const Request> resend) {
    if (route == control_) {
      route->Call(request, response, deadline, std::move(done));
      return;
    }
    std::weak_ptr<FastPathChannel> self = weak_from_this();
    route->Call(request, response, deadline,
                [self, route, response, deadline, resend = std::move(resend),
                 done = std::move(done)](absl::Status status) mutable {
                  auto channel = self.lock();
                  // The server's own verdict (it answered: the route works),
                  // or the transport's failure to reach it.
                  const bool answered = response->header.status_code() != 0;
                  if (channel == nullptr) {
                    done(std::move(status));
                  } else if (answered || (!absl::IsUnavailable(status) && !absl::IsDeadlineExceeded(status))) {
                    channel->Carried(route);
                    done(std::move(status));
                  } else if (channel->Failed(route, status) && resend != nullptr) {
                    channel->control_->Call(*resend, response, deadline, std::move(done));
                  } else {
                    done(std::move(status));
                  }
                });
  }

  void SayMoved(const RouteTrial::Choice& choice) {
    const bool to_grpc = choice.route == RouteTrial::kControl;
    const std::string taken = to_grpc ? "gRPC" : fast_kind_, left = to_grpc ? fast_kind_ : "gRPC";
    absl::FPrintF(stderr,
                  "shoal: calls to %s now go over %s, which carried %.0f a second against %.0f over %s%s; "
                  "trying %s again every %d s\n",
                  task().ToString(), taken, choice.rate_taken, choice.rate_left, left,
                  to_grpc ? " (a busy machine?)" : "", left, absl::ToInt64Seconds(RouteTrial::kTrialEvery));
  }

  void Carried(const std::shared_ptr<Channel>& route) {
    absl::MutexLock lock(&mu_);
    if (route_ == route) route_proven_ = true;
  }

  // A call over fast `route` failed with `status`. A route that had carried
  // calls was lost: ask again next time (the task may be back elsewhere). A
  // call unanswered by its deadline drops the connection too: the next goes
  // over a fresh one. (A ps killed mid-job once left a chief's calls on a
  // live UCX connection unanswered until the job gave up, about one run in
  // eight of ModeFaultTest sync_ps0.) A route that never carried one cannot
  // be reached from here (a firewall, no common network) while the task
  // answers over gRPC: calls go over gRPC for a while. True then.
  bool Failed(const std::shared_ptr<Channel>& route, const absl::Status& status) {
    std::string fast_address;
    {
      absl::MutexLock lock(&mu_);
      if (route_ != route) return false;  // already replaced
      if (route_proven_) {
        route_ = nullptr;
        return false;
      }
      route_ = control_;
      fall_back_until_ = absl::Now() + kFallBackFor;
      fast_address = fast_address_;
    }
    absl::FPrintF(stderr,
                  "shoal: %s serves %s at %s, which this task cannot reach (%s); calling it over gRPC for the "
                  "next %s\n",
                  task().ToString(), fast_kind_, fast_address, status.ToString(),
                  absl::StrCat(absl::ToInt64Seconds(kFallBackFor), " s"));
    return true;
  }

  // Asks the task over gRPC where it serves the fast transport.
  void Ask(absl::Time deadline) {
    auto request = std::make_shared<Request>();
    request->header.mutable_endpoints();
    auto response = std::make_shared<Response>();
    std::shared_ptr<FastPathChannel> self = shared_from_this();
    control_->Call(*request, response.get(), deadline, [self, request, response](absl::Status status) {
      self->Answered(status, *response);
    });
  }

  void Answered(const absl::Status& status, const Response& response) {
    std::shared_ptr<Channel> route;
    std::string fast_address;
    absl::Status failure;
    if (status.ok() && response.header.endpoints().fast_kind() == fast_kind_ &&
        response.header.endpoints().fast_port() > 0) {
      fast_address = absl::StrCat(host_, ":", response.header.endpoints().fast_port());
      auto fast = fast_->Connect(task(), fast_address);
      if (fast.ok()) {
        route = *std::move(fast);
      } else {
        failure = fast.status();
      }
    } else if (status.ok() || (!absl::IsUnavailable(status) && !absl::IsDeadlineExceeded(status))) {
      route = control_;  // the task serves gRPC only (or cannot say): use it
    } else {
      failure = status;  // the task is not reachable yet
    }
    std::deque<std::shared_ptr<Waiting>> waiting;
    {
      absl::MutexLock lock(&mu_);
      asking_ = false;
      route_ = route;
      route_proven_ = false;
      fall_back_until_ = absl::InfiniteFuture();
      fast_address_ = fast_address;
      waiting.swap(waiting_);
    }
    for (std::shared_ptr<Waiting>& w : waiting) {
      if (route == nullptr) {
        w->done(failure);
      } else {
        // The waiting call's own copy of the request serves as the resend.
        auto done = std::move(w->done);
        std::shared_ptr<const Request> resend(w, &w->request);
        Send(route, w->request, w->response, w->deadline, std::move(done), std::move(resend));
      }
    }
  }

  const std::string host_;
  const std::shared_ptr<Channel> control_;
  Transport* const fast_;
  const std::string fast_kind_;
  const bool try_routes_;
  absl::Mutex mu_;
  // Null until the task has said; control_ for a task that serves gRPC
  // only, or (until fall_back_until_) one whose fast endpoint is out of
  // reach.
  std::shared_ptr<Channel> route_ ABSL_GUARDED_BY(mu_);
  bool route_proven_ ABSL_GUARDED_BY(mu_) = false;  // a call has gone over the fast route_
  absl::Time fall_back_until_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::string fast_address_ ABSL_GUARDED_BY(mu_);
  bool asking_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::shared_ptr<Waiting>> waiting_ ABSL_GUARDED_BY(mu_);
  RouteTrial trial_ ABSL_GUARDED_BY(mu_);  // once route_ is a proven fast route: it or gRPC
};

}  // namespace

FastPathTransport::FastPathTransport(std::unique_ptr<Transport> control, std::unique_ptr<Transport> fast,
                                     std::string fast_kind, bool try_routes)
    : control_(std::move(control)), fast_(std::move(fast)), fast_kind_(std::move(fast_kind)), try_routes_(try_routes) {}

absl::StatusOr<std::unique_ptr<ServerHandle>> FastPathTransport::Serve(const std::string& address,
                                                                      VariableService* service) {
  // The fast server first: a gRPC server that answered an `endpoints`
  // request before the advertisement would send that channel over gRPC
  // for good.
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<ServerHandle> fast, fast_->Serve(HostPart(address) + ":0", service));
  const std::string fast_address = fast->address();
  int port = 0;
  if (!absl::SimpleAtoi(fast_address.substr(fast_address.rfind(':') + 1), &port) || port <= 0) {
    return absl::InternalError(absl::StrCat(service->options().task_name, ": the fast transport serves at '",
                                            fast_address, "', which has no port"));
  }
  service->AdvertiseFastEndpoint(fast_kind_, port);
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<ServerHandle> control, control_->Serve(address, service));
  return std::unique_ptr<ServerHandle>(new FastPathServer(std::move(control), std::move(fast)));
}

absl::StatusOr<std::shared_ptr<Channel>> FastPathTransport::Connect(const TaskId& task, const std::string& address) {
  SHOAL_ASSIGN_OR_RETURN(std::shared_ptr<Channel> control, control_->Connect(task, address));
  return std::shared_ptr<Channel>(
      std::make_shared<FastPathChannel>(task, address, std::move(control), fast_.get(), fast_kind_, try_routes_));
}

}  // namespace shoal
