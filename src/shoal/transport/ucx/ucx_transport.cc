#include "shoal/transport/ucx/ucx_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "shoal/core/codec.h"
#include "shoal/core/constant_time.h"
#include "shoal/core/status.h"
#include "shoal/transport/ucx/am_format.h"
#include "shoal/transport/ucx/handshake.h"
#include "shoal/transport/ucx/ucx_loop.h"

namespace shoal {
namespace {

constexpr size_t kHeaderSlack = 16 << 20;  // room for headers beyond the tensor payload
constexpr int kMaxPendingHandshakes = 64;
// By default a server fetches at most this many largest messages' worth of
// requests at once (UcxOptions::receive_budget_bytes).
constexpr size_t kReceiveBudgetMessages = 2;
constexpr absl::Duration kHandshakeTimeout = absl::Seconds(10);
// How long closing endpoints may take when a loop stops.
constexpr absl::Duration kCloseTimeout = absl::Seconds(1);

size_t AlignUp(size_t n) { return (n + kBodyAlignment - 1) / kBodyAlignment * kBodyAlignment; }

// Null when there is no memory for it.
std::shared_ptr<char> AllocateAligned(size_t bytes) {
  const size_t size = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  char* memory = static_cast<char*>(std::aligned_alloc(64, size));
  if (memory == nullptr) return nullptr;
  return std::shared_ptr<char>(memory, &std::free);
}

// A message on its way out: UCX reads the header and the I/O vector (the
// codec's header frame unless the header carries it, then the tensors' own
// memory) until the send completes, so all of it lives here until then.
struct Outgoing {
  std::string am_header;  // the fixed header; then the frame, if it fits
  EncodedMessage encoded;
  std::vector<ucp_dt_iov_t> iov;
  std::shared_ptr<char> flat;  // the whole message in one buffer, when sent so
  UcxWorker* worker = nullptr;  // while UCX holds it
};

const char kPadding[kBodyAlignment] = {};

std::unique_ptr<Outgoing> MakeOutgoing(EncodedMessage encoded, const void* header, size_t header_bytes) {
  auto out = std::make_unique<Outgoing>();
  out->am_header.assign(static_cast<const char*>(header), header_bytes);
  out->encoded = std::move(encoded);
  return out;
}

// Lays `out` out for `worker`: the frame into the header if it fits there,
// else at the head of the data (see RequestAmHeader).
void LayOut(const UcxWorker& worker, Outgoing* out) {
  const std::string& frame = out->encoded.header_frame;
  out->iov.clear();
  if (out->am_header.size() + frame.size() <= worker.max_am_header()) {
    out->am_header += frame;
  } else {
    out->iov.push_back({const_cast<char*>(frame.data()), frame.size()});
    if (AlignUp(frame.size()) != frame.size()) {
      out->iov.push_back({const_cast<char*>(kPadding), AlignUp(frame.size()) - frame.size()});
    }
  }
  for (torch::Tensor& body : out->encoded.bodies) {
    if (body.nbytes() > 0) out->iov.push_back({body.data_ptr(), body.nbytes()});
  }
}

// Copies the message into one contiguous buffer. UCX 1.13 moves an I/O
// vector over TCP by a slow path (1 GB/s against 4 GB/s for one buffer on
// loopback, `ucx_perftest -t ucp_am_lat -D iov`), so for peers reached by
// TCP one copy costs less; over shared memory the vector goes as it is.
void Flatten(Outgoing* out) {
  if (out->iov.size() <= 1) return;
  size_t total = 0;
  for (const ucp_dt_iov_t& piece : out->iov) total += piece.length;
  out->flat = AllocateAligned(total);
  if (out->flat == nullptr) return;  // no memory for the copy: the vector goes as it is
  size_t offset = 0;
  for (const ucp_dt_iov_t& piece : out->iov) {
    std::memcpy(out->flat.get() + offset, piece.buffer, piece.length);
    offset += piece.length;
  }
  out->iov = {{out->flat.get(), total}};
  out->encoded.bodies.clear();
}

// Hands `out` to UCX, on `ep` of `worker`. Returns the failure if UCX
// refused it at once.
ucs_status_t SendAm(UcxWorker* worker, ucp_ep_h ep, unsigned id, std::unique_ptr<Outgoing> out, bool contiguous) {
  LayOut(*worker, out.get());
  if (contiguous) Flatten(out.get());
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
  param.cb.send = [](void* request, ucs_status_t, void* user_data) {
    auto* sent = static_cast<Outgoing*>(user_data);
    sent->worker->RequestEnded();
    delete sent;
    ucp_request_free(request);
  };
  param.user_data = out.get();
  const void* buffer = out->iov.data();
  size_t count = out->iov.size();
  // To a peer over shared memory even one buffer goes as an I/O vector:
  // UCX 1.13 then pipelines it through its FIFO, both sides copying at
  // once, where one buffer is read by the receiver alone (cma), which
  // measured 10-30% slower here for 1 MiB. (On a busy machine cma was 3x
  // faster for the main job, but UCX 1.13 aborts the reading process when
  // the peer dies during a cma read: a killed ps would take its workers.)
  if (count == 0) {
    param.datatype = ucp_dt_make_contig(1);
    buffer = nullptr;
  } else if (count == 1 && contiguous) {
    param.datatype = ucp_dt_make_contig(1);
    buffer = out->iov[0].buffer;
    count = out->iov[0].length;
  } else {
    param.datatype = ucp_dt_make_iov();
  }
  ucs_status_ptr_t sent = ucp_am_send_nbx(ep, id, out->am_header.data(), out->am_header.size(), buffer, count, &param);
  if (sent == nullptr) return UCS_OK;  // done already; `out` goes now
  if (UCS_PTR_IS_ERR(sent)) return UCS_PTR_STATUS(sent);
  out->worker = worker;
  worker->RequestStarted();
  out.release();  // the callback deletes it
  return UCS_OK;
}

// An active message's data, fetched into a fresh aligned buffer; `deliver`
// runs on the loop (after the worker's progress) once all of it is there,
// or with a null buffer when it could not be (no memory, the peer gone).
// Rendezvous data is fetched by UCX straight into the buffer (one copy, by
// shared memory or the network); eager data is copied out of UCX's buffer.
struct Incoming {
  std::shared_ptr<char> buffer;
  size_t length;
  std::function<void(std::shared_ptr<char>, size_t)> deliver;
  UcxLoop* loop;
  UcxWorker* worker;

  // Hands the buffer (null: nothing) to `deliver` on the loop; deletes this.
  void Finish(bool received) {
    if (!received) buffer.reset();
    loop->Post([this] {
      deliver(std::move(buffer), length);
      delete this;
    });
  }
};

void Receive(UcxLoop* loop, UcxWorker* worker, void* data, size_t length, const ucp_am_recv_param_t* param,
             std::function<void(std::shared_ptr<char>, size_t)> deliver) {
  auto* in = new Incoming{AllocateAligned(length), length, std::move(deliver), loop, worker};
  const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (in->buffer == nullptr) {
    in->Finish(false);  // no memory: returning from the callback drops the data
    return;
  }
  if (!rendezvous) {
    std::memcpy(in->buffer.get(), data, length);
    in->Finish(true);
    return;
  }
  ucp_request_param_t receive{};
  receive.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  receive.user_data = in;
  receive.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user_data) {
    auto* fetched = static_cast<Incoming*>(user_data);
    fetched->worker->RequestEnded();
    fetched->Finish(status == UCS_OK);  // not OK: the peer went away
    ucp_request_free(request);
  };
  ucs_status_ptr_t started = ucp_am_recv_data_nbx(worker->get(), data, in->buffer.get(), length, &receive);
  if (started == nullptr) {
    in->Finish(true);
  } else if (UCS_PTR_IS_ERR(started)) {
    in->Finish(false);
  } else {
    worker->RequestStarted();
  }
}

// The codec's header frame of a message whose active-message header is
// `header` (`fixed` bytes of shoal's header, then perhaps the frame): a
// copy of it (the header lives only during UCX's callback), or null when
// the frame leads the data. DataLoss for a header of any other length.
absl::StatusOr<std::shared_ptr<char>> FrameFromHeader(const void* header, size_t header_length, size_t fixed,
                                                      uint64_t frame_bytes) {
  if (header_length == fixed) return nullptr;
  if (header_length < fixed || header_length - fixed != frame_bytes) {
    return absl::DataLossError(absl::StrCat("garbled message: a header of ", header_length, " bytes"));
  }
  std::shared_ptr<char> frame = AllocateAligned(frame_bytes);
  if (frame == nullptr) return absl::ResourceExhaustedError("no memory for a message's header");
  std::memcpy(frame.get(), static_cast<const char*>(header) + fixed, frame_bytes);
  return frame;
}

// The frame and the tensor bytes of a received message, as the codec's
// chunks: the frame from the header (`header_frame`) or from the data.
absl::Status SplitReceived(const std::shared_ptr<char>& header_frame, const std::shared_ptr<char>& buffer,
                           size_t length, uint64_t frame_bytes, std::vector<absl::string_view>* views,
                           std::vector<ChunkOwner>* owners) {
  if (header_frame != nullptr) {
    views->emplace_back(header_frame.get(), frame_bytes);
    owners->push_back(header_frame);
    if (length > 0) {
      views->emplace_back(buffer.get(), length);
      owners->push_back(buffer);
    }
    return absl::OkStatus();
  }
  if (frame_bytes > length || (length > frame_bytes && AlignUp(frame_bytes) > length)) {
    return absl::DataLossError(absl::StrCat("garbled message: a header frame of ", frame_bytes, " bytes in ", length));
  }
  views->emplace_back(buffer.get(), frame_bytes);
  if (length > frame_bytes) views->emplace_back(buffer.get() + AlignUp(frame_bytes), length - AlignUp(frame_bytes));
  owners->assign(views->size(), buffer);
  return absl::OkStatus();
}

// Whether the peer at the other end of liveness socket `fd` has closed it
// (its process ended) or the socket failed: nothing sent to it can arrive.
bool PeerHungUp(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
}

// Closes endpoints as a transport stops, and waits (at most kCloseTimeout)
// for them to finish: `live` ones flush what is in flight first (their
// peers' liveness sockets must stay open until then: a peer retires its
// worker when its socket closes, and a flush to a retired worker fails,
// which UCX logs as an error); `gone` ones (PeerHungUp) are closed at once.
// (A connection that ends while its transport goes on retires its worker
// instead: UcxLoop::RemoveWorker.)
void CloseAll(UcxLoop* loop, const std::vector<ucp_ep_h>& live, const std::vector<ucp_ep_h>& gone) {
  std::vector<void*> closing;
  auto close = [&](ucp_ep_h ep, bool force) {
    ucp_request_param_t param{};
    if (force) {
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    }
    ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
    if (UCS_PTR_IS_PTR(request)) closing.push_back(request);
  };
  for (ucp_ep_h ep : live) close(ep, /*force=*/false);
  for (ucp_ep_h ep : gone) close(ep, /*force=*/true);
  loop->ProgressUntil(
      [&] {
        for (void* r : closing) {
          if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
        }
        return true;
      },
      absl::Now() + kCloseTimeout);
  for (void* r : closing) ucp_request_free(r);
}

// An endpoint to a peer's worker. Peers on this host and network namespace
// get every transport (shared memory among them); others need UCX's
// peer-failure handling, which its shared-memory transports lack.
absl::StatusOr<ucp_ep_h> CreateEndpoint(UcxWorker* worker, const std::string& address, bool same_host,
                                        ucp_err_handler_cb_t on_error, void* error_arg) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  params.err_mode = same_host ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
  if (!same_host) {
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_handler.cb = on_error;
    params.err_handler.arg = error_arg;
  }
  ucp_ep_h ep = nullptr;
  ucs_status_t status = ucp_ep_create(worker->get(), &params, &ep);
  if (status != UCS_OK) return absl::UnavailableError("cannot reach its UCX worker: " + UcxError(status));
  return ep;
}

// Whether UCX may use shared memory to a peer on this host, given its
// transport list (the option, or else UCX_TLS; none: all of UCX's).
bool MayUseSharedMemory(const std::string& option) {
  const char* env = std::getenv("UCX_TLS");
  const std::string list = !option.empty() ? option : env != nullptr ? env : "";
  if (list.empty() || list.find("all") != std::string::npos || list[0] == '^') return true;
  for (const char* shm : {"posix", "sysv", "cma", "sm", "shm", "knem", "xpmem"}) {
    if (list.find(shm) != std::string::npos) return true;
  }
  return false;
}

ConnectionSecret DrawSecret() {
  ConnectionSecret secret{};
  size_t got = 0;
  while (got < sizeof(secret)) {
    ssize_t n = getrandom(reinterpret_cast<char*>(secret.data()) + got, sizeof(secret) - got, 0);
    if (n > 0) got += n;
  }
  return secret;
}

bool SecretsEqual(const ConnectionSecret& a, const ConnectionSecret& b) {
  return ConstantTimeEquals(absl::string_view(reinterpret_cast<const char*>(a.data()), sizeof(a)),
                            absl::string_view(reinterpret_cast<const char*>(b.data()), sizeof(b)));
}

std::string PeerName(int fd) {
  sockaddr_storage peer{};
  socklen_t length = sizeof(peer);
  // As gRPC names peers ("ipv4:127.0.0.1:5000"), which IsPeerOfJob reads.
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) return "unknown";
  char host[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (peer.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&peer);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
    return absl::StrCat("ipv4:", host, ":", port);
  }
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&peer);
  inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
  return absl::StrCat("ipv6:[", host, "]:", ntohs(in6->sin6_port));
}

// ---------------------------------------------------------------- server

// A server runs `connections_per_peer` loops (lanes), each serving the
// connections given to it: a client's lanes, and different clients, are
// then served on different threads. Lane 0 also listens; each accepted
// socket goes to the lane with the fewest, which does the handshake and
// everything after it on its own loop.
class UcxServer final : public ServerHandle {
 public:
  UcxServer(std::vector<std::unique_ptr<UcxLoop>> loops, int listen_fd, std::string address,
            VariableService* service, const UcxOptions& options)
      : listen_fd_(listen_fd), address_(std::move(address)), service_(service), options_(options),
        receive_budget_bytes_(options.receive_budget_bytes > 0
                                  ? options.receive_budget_bytes
                                  : kReceiveBudgetMessages * (options.max_message_bytes + kHeaderSlack)),
        host_id_(HostId()), shared_memory_(MayUseSharedMemory(options.ucx_transports)) {
    executor_ = options.executor ? options.executor : BlockingExecutor::Shared();
    for (auto& loop : loops) {
      lanes_.push_back(std::make_unique<Lane>());
      lanes_.back()->server = this;
      lanes_.back()->loop = std::move(loop);
    }
  }

  // Listens, on lane 0's loop; returns once it does.
  void Start() {
    absl::Notification started;
    lanes_[0]->loop->Post([this, &started] {
      lanes_[0]->loop->Watch(listen_fd_, EPOLLIN, [this](uint32_t) { Accept(); });
      started.Notify();
    });
    started.WaitForNotification();
  }

  ~UcxServer() override {
    // Stop taking connections and requests, let the waiting requests (long
    // polls) finish and answer, then close every connection.
    // Once a lane's `closing` is set (on its loop) it serves no request, so
    // no new waiting request starts on the executor. Lane 0 stops
    // listening first: no socket is handed to a lane after that.
    for (auto& lane : lanes_) {
      absl::Notification closed;
      lane->loop->Post([this, lane = lane.get(), &closed] {
        if (lane == lanes_[0].get()) {
          lane->loop->Unwatch(listen_fd_);
          close(listen_fd_);
        }
        lane->closing = true;
        closed.Notify();
      });
      closed.WaitForNotification();
    }
    {
      absl::MutexLock lock(&waiting_mu_);
      waiting_mu_.Await(absl::Condition(+[](int* n) { return *n == 0; }, &waiting_));
    }
    for (auto& lane : lanes_) {
      lane->loop->Stop([lane = lane.get()] {
        std::vector<ucp_ep_h> live, gone;
        for (auto& [id, connection] : lane->connections) {
          lane->loop->Unwatch(connection.fd);
          (PeerHungUp(connection.fd) ? gone : live).push_back(connection.ep);
        }
        for (auto& [fd, handshake] : lane->handshakes) {
          lane->loop->Unwatch(fd);
          close(fd);
        }
        lane->handshakes.clear();
        CloseAll(lane->loop.get(), live, gone);
        for (auto& [id, connection] : lane->connections) close(connection.fd);
        lane->connections.clear();  // their workers go with the loop
      });
    }
  }

  std::string address() const override { return address_; }

 private:
  struct Connection {
    int fd;
    UcxWorker* worker;  // this connection's own
    ucp_ep_h ep;
    ConnectionSecret secret;
    std::string peer;
    bool contiguous;  // no shared memory to this peer: send one buffer
  };
  struct Handshake {
    std::string bytes;
    uint64_t timer;
  };
  struct Lane {
    UcxServer* server;
    std::unique_ptr<UcxLoop> loop;
    // Sockets given to this lane and not yet closed (handshakes and
    // connections): how the listener picks a lane. Any thread.
    std::atomic<size_t> sockets{0};
    // The lane's loop thread only.
    std::map<uint64_t, Connection> connections;
    std::map<int, Handshake> handshakes;
    bool closing = false;
  };

  // On lane 0's loop: hands each new socket to the lane with the fewest.
  void Accept() {
    while (true) {
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      Lane* lane = lanes_[0].get();
      for (auto& other : lanes_) {
        if (other->sockets < lane->sockets) lane = other.get();
      }
      ++lane->sockets;
      if (!lane->loop->Post([this, lane, fd] { Adopt(lane, fd); })) {
        close(fd);
        --lane->sockets;
      }
    }
  }

  // On `lane`'s loop: waits for the socket's Hello.
  void Adopt(Lane* lane, int fd) {
    if (lane->closing || static_cast<int>(lane->handshakes.size()) >= kMaxPendingHandshakes) {
      close(fd);
      --lane->sockets;
      return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    const uint64_t timer = lane->loop->At(absl::Now() + kHandshakeTimeout, [this, lane, fd] { DropHandshake(lane, fd); });
    lane->handshakes[fd] = Handshake{std::string(), timer};
    lane->loop->Watch(fd, EPOLLIN | EPOLLRDHUP, [this, lane, fd](uint32_t) { ReadHandshake(lane, fd); });
  }

  void DropHandshake(Lane* lane, int fd) {
    auto it = lane->handshakes.find(fd);
    if (it == lane->handshakes.end()) return;
    lane->loop->Cancel(it->second.timer);
    lane->handshakes.erase(it);
    lane->loop->Unwatch(fd);
    close(fd);
    --lane->sockets;
  }

  void ReadHandshake(Lane* lane, int fd) {
    auto it = lane->handshakes.find(fd);
    if (it == lane->handshakes.end()) return;
    std::string& bytes = it->second.bytes;
    char chunk[4096];
    const size_t room = kMaxHelloBytes - bytes.size();
    ssize_t n = recv(fd, chunk, std::min(sizeof(chunk), std::max<size_t>(room, 1)), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      DropHandshake(lane, fd);
      return;
    }
    if (n < 0) return;
    bytes.append(chunk, n);
    Hello hello;
    bool complete = false;
    absl::Status parsed = ParseHello(bytes, &hello, &complete);
    if (!parsed.ok() || bytes.size() > kMaxHelloBytes) {
      DropHandshake(lane, fd);
      return;
    }
    if (!complete) return;
    lane->loop->Cancel(it->second.timer);
    lane->handshakes.erase(it);
    lane->loop->Unwatch(fd);
    Welcome welcome = Greet(lane, fd, hello);
    const std::string answer = EncodeWelcome(welcome);
    const bool sent = send(fd, answer.data(), answer.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(answer.size());
    if (!welcome.status.ok() || !sent) {
      auto refused = lane->connections.find(welcome.connection_id);
      if (refused != lane->connections.end()) {
        lane->loop->RemoveWorker(refused->second.worker);
        lane->connections.erase(refused);
        --connections_held_;
      }
      close(fd);
      --lane->sockets;
      return;
    }
    const uint64_t id = welcome.connection_id;
    lane->loop->Watch(fd, EPOLLIN | EPOLLRDHUP, [this, lane, id](uint32_t) { CheckAlive(lane, id); });
  }

  // Checks the token (in constant time) before anything is made for the
  // client, then makes its connection.
  Welcome Greet(Lane* lane, int fd, const Hello& hello) {
    Welcome welcome;
    if (!options_.token.empty() && (hello.token.empty() || !ConstantTimeEquals(hello.token, options_.token))) {
      welcome.status = absl::UnauthenticatedError(absl::StrCat(service_->options().task_name, " refused a connection with ",
                                                               hello.token.empty() ? "no token" : "a wrong token"));
      return welcome;
    }
    // A place among the connections, taken before the worker is made (the
    // lanes greet at once), and given back if none is.
    if (connections_held_.fetch_add(1) >= options_.max_connections) {
      --connections_held_;
      welcome.status = absl::ResourceExhaustedError(absl::StrCat(
          service_->options().task_name, " holds ", options_.max_connections, " UCX connections, the most it takes"));
      return welcome;
    }
    absl::StatusOr<UcxWorker*> worker = lane->loop->AddWorker();
    if (!worker.ok()) {
      --connections_held_;
      welcome.status = worker.status();
      return welcome;
    }
    const uint64_t id = next_connection_++;
    (*worker)->OnMessage(kRequestAm, [this, lane, id, w = *worker](const void* header, size_t header_length,
                                                                   void* data, size_t length,
                                                                   const ucp_am_recv_param_t* param) {
      OnRequest(lane, id, w, header, header_length, data, length, param);
    });
    const bool same_host = hello.host_id == host_id_;
    auto ep = CreateEndpoint(*worker, hello.worker_address, same_host, &UcxServer::OnEndpointError, lane);
    const bool contiguous = !(same_host && shared_memory_);
    if (!ep.ok()) {
      lane->loop->RemoveWorker(*worker);
      --connections_held_;
      welcome.status = Annotate(ep.status(), service_->options().task_name);
      return welcome;
    }
    welcome.connection_id = id;
    welcome.secret = DrawSecret();
    welcome.host_id = host_id_;
    welcome.worker_address = (*worker)->address();
    lane->connections[id] = Connection{fd, *worker, *ep, welcome.secret, PeerName(fd), contiguous};
    return welcome;
  }

  // The handshake socket of a connection became readable: the client went
  // away (or broke the protocol). Either way the connection ends.
  void CheckAlive(Lane* lane, uint64_t id) {
    auto it = lane->connections.find(id);
    if (it != lane->connections.end() && PeerHungUp(it->second.fd)) CloseConnection(lane, id);
  }

  // The client is gone (or broke the protocol): its worker is retired.
  void CloseConnection(Lane* lane, uint64_t id) {
    auto it = lane->connections.find(id);
    if (it == lane->connections.end()) return;
    lane->loop->Unwatch(it->second.fd);
    close(it->second.fd);
    lane->loop->RemoveWorker(it->second.worker);
    lane->connections.erase(it);
    --connections_held_;
    --lane->sockets;
  }

  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t) {
    auto* lane = static_cast<Lane*>(arg);
    for (auto& [id, connection] : lane->connections) {
      if (connection.ep == ep) {
        const uint64_t dead = id;
        lane->loop->Post([lane, dead] { lane->server->CloseConnection(lane, dead); });
        return;
      }
    }
  }

  // Answers a request that is refused before its data is fetched.
  void Refuse(Lane* lane, uint64_t connection_id, uint64_t call_id, absl::Status status) {
    Response refusal;
    SetErrorStatus(std::move(status), &refusal);
    Answer(lane, connection_id, call_id, std::move(refusal));
  }

  // A request on connection `id`'s worker, in its active message's callback.
  // Returning without Receive drops its data, eager or rendezvous: UCX
  // drops a rendezvous descriptor that the callback neither received nor
  // kept. (ucp_am_data_release is for data kept past the callback; called
  // here, it crashed the process in UCX 1.13, so a refused large request
  // killed its server.)
  void OnRequest(Lane* lane, uint64_t id, UcxWorker* worker, const void* header, size_t header_length, void* data,
                 size_t length, const ucp_am_recv_param_t* param) {
    RequestAmHeader h;
    if (header_length < sizeof(h) || lane->closing) return;
    std::memcpy(&h, header, sizeof(h));
    auto it = lane->connections.find(h.connection_id);
    if (h.connection_id != id || it == lane->connections.end() || !SecretsEqual(it->second.secret, h.secret)) {
      return;  // not a client that passed the handshake: nothing is read
    }
    absl::StatusOr<std::shared_ptr<char>> header_frame =
        FrameFromHeader(header, header_length, sizeof(h), h.frame_bytes);
    if (!header_frame.ok()) {
      Refuse(lane, h.connection_id, h.call_id,
             Annotate(header_frame.status(), absl::StrCat("request to ", service_->options().task_name)));
      return;
    }
    if (length > options_.max_message_bytes + kHeaderSlack) {
      Refuse(lane, h.connection_id, h.call_id,
             absl::ResourceExhaustedError(absl::StrCat("message of ", length, " bytes to ",
                                                       service_->options().task_name, " exceeds the limit of ",
                                                       options_.max_message_bytes, " bytes")));
      return;
    }
    // What all requests being received, on every lane, may hold at once: a
    // flood of large messages is refused, not buffered.
    const size_t receiving = receiving_bytes_.fetch_add(length);
    if (receiving + length > receive_budget_bytes_) {
      receiving_bytes_ -= length;
      Refuse(lane, h.connection_id, h.call_id,
             absl::ResourceExhaustedError(absl::StrCat(service_->options().task_name, " is receiving ", receiving,
                                                       " bytes already; try again")));
      return;
    }
    const uint64_t connection_id = h.connection_id, call_id = h.call_id, frame_bytes = h.frame_bytes;
    Receive(lane->loop.get(), worker, data, length, param,
            [this, lane, connection_id, call_id, frame_bytes, frame = *std::move(header_frame)](
                std::shared_ptr<char> buffer, size_t length) {
              receiving_bytes_ -= length;
              if (buffer == nullptr) return;  // the client went away (or no memory): nothing to answer
              Serve(lane, connection_id, call_id, frame, std::move(buffer), length, frame_bytes);
            });
  }

  void SetErrorStatus(absl::Status status, Response* response) {
    response->header.set_status_code(static_cast<int>(status.code()));
    response->header.set_status_message(std::string(status.message()));
  }

  void Serve(Lane* lane, uint64_t connection_id, uint64_t call_id, const std::shared_ptr<char>& header_frame,
             std::shared_ptr<char> buffer, size_t length, uint64_t frame_bytes) {
    auto connection = lane->connections.find(connection_id);
    if (connection == lane->connections.end() || lane->closing) return;  // closing: the client sees the connection end
    auto request = std::make_shared<Request>();
    request->peer = connection->second.peer;
    std::vector<absl::string_view> views;
    std::vector<ChunkOwner> owners;
    absl::Status decoded = SplitReceived(header_frame, buffer, length, frame_bytes, &views, &owners);
    if (decoded.ok()) decoded = DecodeRequest(views, options_.max_message_bytes + kHeaderSlack, request.get(), owners);
    Response response;
    if (!decoded.ok()) {
      // A garbled or refused request is answered, and the server goes on serving.
      SetErrorStatus(Annotate(decoded, absl::StrCat("request to ", service_->options().task_name)), &response);
    } else if (VariableService::TakesLong(*request)) {
      // A long poll must not hold the loop, which serves the very calls
      // that end its wait; nor may a save, which would stall every call
      // queued behind it on this loop.
      {
        absl::MutexLock lock(&waiting_mu_);
        ++waiting_;
      }
      const bool queued = executor_->TrySubmit([this, lane, request, connection_id, call_id] {
        auto answer = std::make_shared<Response>();
        service_->Handle(*request, answer.get());
        lane->loop->Post(
            [this, lane, answer, connection_id, call_id] { Answer(lane, connection_id, call_id, std::move(*answer)); });
        absl::MutexLock lock(&waiting_mu_);
        --waiting_;
      });
      if (queued) return;
      {
        absl::MutexLock lock(&waiting_mu_);
        --waiting_;
      }
      SetErrorStatus(absl::ResourceExhaustedError(absl::StrCat(
                         service_->options().task_name, " is already serving ", executor_->max_pending(),
                         " calls that wait or take long (the most at once); try again")),
                     &response);
    } else {
      service_->Handle(*request, &response);
    }
    Answer(lane, connection_id, call_id, std::move(response));
  }

  void Answer(Lane* lane, uint64_t connection_id, uint64_t call_id, Response response) {
    auto connection = lane->connections.find(connection_id);
    if (connection == lane->connections.end()) return;  // the client went away
    auto encoded = EncodeResponse(response);
    if (!encoded.ok()) {
      Response failure;
      SetErrorStatus(Annotate(encoded.status(), service_->options().task_name), &failure);
      encoded = EncodeResponse(failure);
      if (!encoded.ok()) return;
    }
    ResponseAmHeader h{call_id, encoded->header_frame.size()};
    SendAm(connection->second.worker, connection->second.ep, kResponseAm,
           MakeOutgoing(*std::move(encoded), &h, sizeof(h)), connection->second.contiguous);
  }

  std::vector<std::unique_ptr<Lane>> lanes_;
  int listen_fd_;
  std::string address_;
  VariableService* service_;
  UcxOptions options_;
  const size_t receive_budget_bytes_;  // options_.receive_budget_bytes, resolved
  std::string host_id_;
  bool shared_memory_;
  std::shared_ptr<BlockingExecutor> executor_;

  std::atomic<uint64_t> next_connection_{1};
  std::atomic<size_t> connections_held_{0};
  std::atomic<size_t> receiving_bytes_{0};  // of requests whose data is being fetched

  absl::Mutex waiting_mu_;
  int waiting_ ABSL_GUARDED_BY(waiting_mu_) = 0;  // requests on the executor
};

}  // namespace

// ---------------------------------------------------------------- client

// The client side of a transport: one loop for all its channels.
class UcxClientSide {
 public:
  struct ChannelState {
    TaskId task;
    std::string address;
    std::string where;
    enum { kIdle, kConnecting, kConnected } state = kIdle;
    int fd = -1;
    UcxWorker* worker = nullptr;  // this connection's own, from connecting until disconnected
    ucp_ep_h ep = nullptr;
    uint64_t connection_id = 0;
    ConnectionSecret secret{};
    bool contiguous = true;  // no shared memory to this peer: send one buffer
    std::vector<uint64_t> waiting;  // calls to send once connected
    std::set<uint64_t> in_flight;
    bool closed = false;
  };

  UcxClientSide(std::shared_ptr<UcxLoop> loop, const UcxOptions& options)
      : loop_(std::move(loop)), options_(options), host_id_(HostId()),
        shared_memory_(MayUseSharedMemory(options.ucx_transports)) {}

  // Fails every call and closes every connection; the loop stops.
  void Shutdown() {
    loop_->Stop([this] {
      std::vector<ucp_ep_h> live, gone;
      for (auto& channel : channels_) {
        if (channel->ep != nullptr) (PeerHungUp(channel->fd) ? gone : live).push_back(channel->ep);
        channel->ep = nullptr;
      }
      CloseAll(loop_.get(), live, gone);  // then Disconnect closes the sockets
      for (auto& channel : channels_) {
        Disconnect(channel.get(), absl::UnavailableError(channel->where + " is unavailable: the transport closed"));
      }
      // Calls still waiting for a connection being made: every call ends.
      while (!calls_.empty()) {
        const auto& [id, call] = *calls_.begin();
        Finish(id, absl::UnavailableError(call->channel->where + " is unavailable: the transport closed"));
      }
    });
  }

  std::shared_ptr<ChannelState> NewChannel(const TaskId& task, const std::string& address) {
    auto channel = std::make_shared<ChannelState>();
    channel->task = task;
    channel->address = address;
    channel->where = absl::StrCat(task.ToString(), " at ", address);
    loop_->Post([this, channel] { channels_.insert(channel); });
    return channel;
  }

  void CloseChannel(std::shared_ptr<ChannelState> channel) {
    loop_->Post([this, channel] {
      channel->closed = true;
      Disconnect(channel.get(), absl::UnavailableError(channel->where + " is unavailable: the channel closed"));
      channels_.erase(channel);
    });
  }

  void Call(std::shared_ptr<ChannelState> channel, const Request& request, Response* response, absl::Time deadline,
            std::function<void(absl::Status)> done) {
    auto encoded = EncodeRequest(request);
    if (!encoded.ok()) {
      done(Annotate(encoded.status(), absl::StrCat("sending to ", channel->where)));
      return;
    }
    if (encoded->total_bytes > options_.max_message_bytes + kHeaderSlack ||
        TensorBytes(request.tensors) > options_.max_message_bytes) {
      done(absl::ResourceExhaustedError(absl::StrCat("message of ", encoded->total_bytes, " bytes to ", channel->where,
                                                     " exceeds the limit of ", options_.max_message_bytes, " bytes")));
      return;
    }
    RequestAmHeader header{};
    header.frame_bytes = encoded->header_frame.size();
    auto call = std::make_shared<PendingCall>();
    call->channel = std::move(channel);
    call->response = response;
    call->done = std::move(done);
    call->outgoing = MakeOutgoing(*std::move(encoded), &header, sizeof(header));
    call->deadline = deadline;
    if (!loop_->Post([this, call] { Start(call); })) {
      auto done_now = std::move(call->done);
      done_now(absl::UnavailableError(call->channel->where + " is unavailable: the transport closed"));
    }
  }

 private:
  struct PendingCall {
    std::shared_ptr<ChannelState> channel;
    Response* response;
    std::function<void(absl::Status)> done;
    std::unique_ptr<Outgoing> outgoing;  // until sent
    absl::Time deadline;
    uint64_t timer = 0;
  };

  void Start(std::shared_ptr<PendingCall> call) {
    const uint64_t id = next_call_++;
    ChannelState* channel = call->channel.get();
    call->timer = loop_->At(call->deadline, [this, id] {
      auto it = calls_.find(id);
      if (it == calls_.end()) return;
      Finish(id, absl::DeadlineExceededError(absl::StrCat(it->second->channel->where,
                                                          " did not answer before the deadline")));
    });
    calls_[id] = call;
    if (channel->closed) {
      Finish(id, absl::UnavailableError(channel->where + " is unavailable: the channel closed"));
      return;
    }
    if (channel->state == ChannelState::kConnected) {
      Send(id);
      return;
    }
    channel->waiting.push_back(id);
    if (channel->state == ChannelState::kIdle) StartConnecting(call->channel);
  }

  // Connects on a thread of its own (a blocking connect and handshake,
  // bounded by the connect timeout), then hands the socket to the loop.
  void StartConnecting(std::shared_ptr<ChannelState> channel) {
    absl::StatusOr<UcxWorker*> worker = loop_->AddWorker();
    if (!worker.ok()) {
      FailWaiting(channel.get(), Annotate(worker.status(), channel->where));
      return;
    }
    channel->state = ChannelState::kConnecting;
    channel->worker = *worker;
    (*worker)->OnMessage(kResponseAm, [this, w = *worker](const void* header, size_t header_length, void* data,
                                                          size_t length, const ucp_am_recv_param_t* param) {
      OnResponse(w, header, header_length, data, length, param);
    });
    Hello hello{options_.token, host_id_, (*worker)->address()};
    const absl::Time deadline = absl::Now() + options_.connect_timeout;
    std::thread([this, loop = loop_, channel, hello, deadline] {
      pthread_setname_np(pthread_self(), "ucx connect");
      auto welcome = std::make_shared<Welcome>();
      absl::StatusOr<int> fd = ConnectAndGreet(channel->address, hello, deadline, welcome.get());
      const bool handed_over = loop->Post([this, channel, fd, welcome] { OnConnected(channel, fd, *welcome); });
      if (!handed_over && fd.ok()) close(*fd);  // the transport closed meanwhile
    }).detach();
  }

  void OnConnected(std::shared_ptr<ChannelState> channel, absl::StatusOr<int> fd, const Welcome& welcome) {
    if (channel->closed) {
      if (fd.ok()) close(*fd);
      loop_->RemoveWorker(channel->worker);
      channel->worker = nullptr;
      return;
    }
    absl::StatusOr<ucp_ep_h> ep = absl::UnknownError("not connected");
    if (fd.ok()) {
      ep = CreateEndpoint(channel->worker, welcome.worker_address, welcome.host_id == host_id_,
                          &UcxClientSide::OnEndpointError, this);
      if (!ep.ok()) close(*fd);
    } else {
      ep = fd.status();
    }
    if (!ep.ok()) {
      channel->state = ChannelState::kIdle;
      loop_->RemoveWorker(channel->worker);
      channel->worker = nullptr;
      const absl::Status& s = ep.status();
      FailWaiting(channel.get(), absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)
                                     ? absl::Status(s.code(), absl::StrCat(channel->task.ToString(), " at ", s.message()))
                                     : Annotate(s, channel->where));
      return;
    }
    channel->state = ChannelState::kConnected;
    channel->fd = *fd;
    channel->ep = *ep;
    channel->connection_id = welcome.connection_id;
    channel->contiguous = !(welcome.host_id == host_id_ && shared_memory_);
    channel->secret = welcome.secret;
    loop_->Watch(channel->fd, EPOLLIN | EPOLLRDHUP, [this, channel](uint32_t) { CheckAlive(channel); });
    std::vector<uint64_t> waiting;
    waiting.swap(channel->waiting);
    for (uint64_t id : waiting) Send(id);
  }

  void CheckAlive(const std::shared_ptr<ChannelState>& channel) {
    if (!PeerHungUp(channel->fd)) return;
    Disconnect(channel.get(),
               absl::UnavailableError(channel->where + " is unavailable: the connection closed (the task ended?)"));
  }

  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* self = static_cast<UcxClientSide*>(arg);
    for (const auto& channel : self->channels_) {
      if (channel->ep == ep) {
        self->loop_->Post([self, channel, status] {
          self->Disconnect(channel.get(),
                           absl::UnavailableError(absl::StrCat(channel->where, " is unavailable: ", UcxError(status))));
        });
        return;
      }
    }
  }

  // Ends the connection (if any) and fails every call on it with `status`.
  // Its worker is retired (a connection being made keeps its worker until
  // it is made).
  void Disconnect(ChannelState* channel, const absl::Status& status) {
    if (channel->fd >= 0) {
      loop_->Unwatch(channel->fd);
      close(channel->fd);
      channel->fd = -1;
    }
    channel->ep = nullptr;
    if (channel->state != ChannelState::kConnecting) {
      channel->state = ChannelState::kIdle;
      if (channel->worker != nullptr) loop_->RemoveWorker(channel->worker);
      channel->worker = nullptr;
    }
    std::set<uint64_t> in_flight;
    in_flight.swap(channel->in_flight);
    for (uint64_t id : in_flight) Finish(id, status);
    if (channel->state != ChannelState::kConnecting) FailWaiting(channel, status);
  }

  // Fails the calls waiting for a connection.
  void FailWaiting(ChannelState* channel, const absl::Status& status) {
    std::vector<uint64_t> waiting;
    waiting.swap(channel->waiting);
    for (uint64_t id : waiting) Finish(id, status);
  }

  void Send(uint64_t id) {
    auto it = calls_.find(id);
    if (it == calls_.end()) return;
    PendingCall& call = *it->second;
    ChannelState* channel = call.channel.get();
    RequestAmHeader header;
    std::memcpy(&header, call.outgoing->am_header.data(), sizeof(header));
    header.connection_id = channel->connection_id;
    header.secret = channel->secret;
    header.call_id = id;
    std::memcpy(call.outgoing->am_header.data(), &header, sizeof(header));
    channel->in_flight.insert(id);
    ucs_status_t status =
        SendAm(channel->worker, channel->ep, kRequestAm, std::move(call.outgoing), channel->contiguous);
    if (status != UCS_OK) {
      Finish(id, absl::UnavailableError(absl::StrCat(channel->where, " is unavailable: ", UcxError(status))));
    }
  }

  // An answer on `worker`'s connection, in its active message's callback
  // (returning without Receive drops its data: see UcxServer::OnRequest).
  void OnResponse(UcxWorker* worker, const void* header, size_t header_length, void* data, size_t length,
                  const ucp_am_recv_param_t* param) {
    ResponseAmHeader h;
    if (header_length < sizeof(h)) return;
    std::memcpy(&h, header, sizeof(h));
    auto it = calls_.find(h.call_id);
    if (it == calls_.end() || it->second->channel->worker != worker) {
      return;  // late (its deadline passed), unknown, or a call to another task
    }
    if (length > options_.max_message_bytes + kHeaderSlack) {
      Finish(h.call_id, absl::ResourceExhaustedError(absl::StrCat("answer of ", length, " bytes from ",
                                                                  it->second->channel->where, " exceeds the limit")));
      return;
    }
    absl::StatusOr<std::shared_ptr<char>> header_frame =
        FrameFromHeader(header, header_length, sizeof(h), h.frame_bytes);
    if (!header_frame.ok()) {
      Finish(h.call_id, Annotate(header_frame.status(), absl::StrCat("answer from ", it->second->channel->where)));
      return;
    }
    const uint64_t id = h.call_id, frame_bytes = h.frame_bytes;
    Receive(loop_.get(), worker, data, length, param,
            [this, id, frame_bytes, frame = *std::move(header_frame)](std::shared_ptr<char> buffer, size_t length) {
              if (buffer == nullptr) {
                Finish(id, absl::ResourceExhaustedError(absl::StrCat("no memory for an answer of ", length, " bytes")));
                return;
              }
              Complete(id, frame, std::move(buffer), length, frame_bytes);
            });
  }

  void Complete(uint64_t id, const std::shared_ptr<char>& header_frame, std::shared_ptr<char> buffer, size_t length,
                uint64_t frame_bytes) {
    auto it = calls_.find(id);
    if (it == calls_.end()) return;
    PendingCall& call = *it->second;
    std::vector<absl::string_view> views;
    std::vector<ChunkOwner> owners;
    absl::Status status = SplitReceived(header_frame, buffer, length, frame_bytes, &views, &owners);
    if (status.ok()) status = DecodeResponse(views, SIZE_MAX, call.response, owners);
    status = status.ok() ? ResponseStatus(call.response->header)
                         : Annotate(status, absl::StrCat("answer from ", call.channel->where));
    Finish(id, status);
  }

  void Finish(uint64_t id, absl::Status status) {
    auto it = calls_.find(id);
    if (it == calls_.end()) return;
    std::shared_ptr<PendingCall> call = std::move(it->second);
    calls_.erase(it);
    loop_->Cancel(call->timer);
    call->channel->in_flight.erase(id);
    auto done = std::move(call->done);
    call.reset();
    done(std::move(status));
  }

  std::shared_ptr<UcxLoop> loop_;
  UcxOptions options_;
  std::string host_id_;
  bool shared_memory_;
  // Loop thread only.
  std::set<std::shared_ptr<ChannelState>> channels_;
  std::map<uint64_t, std::shared_ptr<PendingCall>> calls_;
  uint64_t next_call_ = 1;
};

namespace {

// A channel's lanes: one connection on each of the transport's client
// loops. A call takes the lane with the fewest calls in flight (the first
// of those), so one call at a time always takes lane 0 and the others
// connect only when calls overlap.
class UcxChannel final : public Channel {
 public:
  struct Lane {
    UcxClientSide* client;
    std::shared_ptr<UcxClientSide::ChannelState> state;
  };

  UcxChannel(TaskId task, std::vector<Lane> lanes)
      : Channel(std::move(task)), lanes_(std::move(lanes)), calls_in_flight_(std::make_shared<InFlight>(lanes_.size())) {}
  ~UcxChannel() override {
    for (Lane& lane : lanes_) lane.client->CloseChannel(lane.state);
  }

  void Call(const Request& request, Response* response, absl::Time deadline,
            std::function<void(absl::Status)> done) override {
    InFlight& in_flight = *calls_in_flight_;
    size_t chosen = 0;
    for (size_t i = 1; i < lanes_.size(); ++i) {
      if (in_flight.count[i] < in_flight.count[chosen]) chosen = i;
    }
    ++in_flight.count[chosen];
    // The count outlives the channel: a call may end after it is gone.
    lanes_[chosen].client->Call(lanes_[chosen].state, request, response, deadline,
                                [counts = calls_in_flight_, chosen, done = std::move(done)](absl::Status status) {
                                  --counts->count[chosen];
                                  done(std::move(status));
                                });
  }

 private:
  struct InFlight {
    explicit InFlight(size_t lanes) : count(new std::atomic<int>[lanes]()) {}
    std::unique_ptr<std::atomic<int>[]> count;
  };

  std::vector<Lane> lanes_;
  std::shared_ptr<InFlight> calls_in_flight_;
};

// "name" for the first lane's loop, "name #2" for the second... (short:
// it names the loop's thread too).
std::string LaneName(const std::string& name, int lane) {
  return lane == 0 ? name : absl::StrCat(name, " #", lane + 1);
}

}  // namespace

struct UcxTransport::State {
  UcxOptions options;
  std::shared_ptr<UcxContext> context;
  std::vector<std::unique_ptr<UcxClientSide>> client_lanes;  // made on the first Connect
  absl::Mutex mu;
};

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(UcxOptions options) {
  if (options.connections_per_peer < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("UCX connections_per_peer must be at least 1, not ", options.connections_per_peer));
  }
  auto state = std::make_unique<State>();
  SHOAL_ASSIGN_OR_RETURN(state->context, UcxContext::Create(options.ucx_transports));
  if (!options.executor) options.executor = BlockingExecutor::Shared();
  state->options = std::move(options);
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(state)));
}

UcxTransport::UcxTransport(std::unique_ptr<State> state) : state_(std::move(state)) {}

UcxTransport::~UcxTransport() {
  for (auto& client : state_->client_lanes) client->Shutdown();
}

absl::StatusOr<std::unique_ptr<ServerHandle>> UcxTransport::Serve(const std::string& address,
                                                                  VariableService* service) {
  int port = 0;
  absl::StatusOr<int> fd = ListenTcp(address, &port);
  if (!fd.ok()) return Annotate(fd.status(), absl::StrCat("cannot serve ", service->options().task_name));
  std::vector<std::unique_ptr<UcxLoop>> loops;
  for (int lane = 0; lane < state_->options.connections_per_peer; ++lane) {
    auto loop = UcxLoop::Create(state_->context, LaneName(service->options().task_name, lane),
                                state_->options.stay_awake);
    if (!loop.ok()) {
      close(*fd);
      return loop.status();
    }
    loops.push_back(*std::move(loop));
  }
  std::string host;
  int unused = 0;
  SHOAL_RETURN_IF_ERROR(SplitHostPort(address, &host, &unused));
  if (host.find(':') != std::string::npos) host = absl::StrCat("[", host, "]");
  auto server = std::make_unique<UcxServer>(std::move(loops), *fd, absl::StrCat(host, ":", port), service,
                                            state_->options);
  server->Start();
  return std::unique_ptr<ServerHandle>(std::move(server));
}

absl::StatusOr<std::shared_ptr<Channel>> UcxTransport::Connect(const TaskId& task, const std::string& address) {
  std::string host;
  int port = 0;
  SHOAL_RETURN_IF_ERROR(SplitHostPort(address, &host, &port));
  absl::MutexLock lock(&state_->mu);
  for (int lane = state_->client_lanes.size(); lane < state_->options.connections_per_peer; ++lane) {
    SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<UcxLoop> loop,
                           UcxLoop::Create(state_->context, LaneName("UCX client", lane), state_->options.stay_awake));
    state_->client_lanes.push_back(
        std::make_unique<UcxClientSide>(std::shared_ptr<UcxLoop>(std::move(loop)), state_->options));
  }
  std::vector<UcxChannel::Lane> lanes;
  for (auto& client : state_->client_lanes) lanes.push_back({client.get(), client->NewChannel(task, address)});
  return std::shared_ptr<Channel>(new UcxChannel(task, std::move(lanes)));
}

}  // namespace shoal
