#include "shoal/transport/ucx/handshake.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shoal {
namespace {

constexpr char kMagic[8] = {'S', 'H', 'O', 'A', 'L', 'U', 'C', 'X'};
constexpr uint32_t kVersion = 1;
constexpr size_t kMaxMessageBytes = 1024;
constexpr size_t kWelcomeFixedBytes = 8 + 4 + 4 + 4 + 4 + 8 + 16;

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

// Waits until `fd` has `events` or the deadline passes.
absl::Status WaitFor(int fd, short events, absl::Time deadline, const std::string& where, const char* what) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(where, ": no answer before the deadline while ", what));
    }
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 60000)));
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) return absl::UnavailableError(absl::StrCat(where, ": ", Errno("poll")));
  }
}

absl::Status ReadExactly(int fd, char* out, size_t n, absl::Time deadline, const std::string& where) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = recv(fd, out + got, n - got, 0);
    if (r > 0) {
      got += r;
    } else if (r == 0) {
      return absl::UnavailableError(absl::StrCat(where, " closed the connection during the handshake"));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      absl::Status waited = WaitFor(fd, POLLIN, deadline, where, "reading the handshake");
      if (!waited.ok()) return waited;
    } else if (errno != EINTR) {
      return absl::UnavailableError(absl::StrCat(where, ": ", Errno("reading the handshake")));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string HostId() {
  std::string boot_id;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char line[64] = {};
    if (std::fgets(line, sizeof(line), f) != nullptr) boot_id = line;
    std::fclose(f);
  }
  while (!boot_id.empty() && (boot_id.back() == '\n' || boot_id.back() == ' ')) boot_id.pop_back();
  char netns[128] = {};
  const ssize_t n = readlink("/proc/self/ns/net", netns, sizeof(netns) - 1);
  return absl::StrCat(boot_id, "/", n > 0 ? std::string(netns, n) : std::string("?"));
}

std::string EncodeHello(const Hello& hello) {
  std::string out(kMagic, sizeof(kMagic));
  PutU32(&out, kVersion);
  PutU32(&out, static_cast<uint32_t>(hello.token.size()));
  PutU32(&out, static_cast<uint32_t>(hello.host_id.size()));
  PutU32(&out, static_cast<uint32_t>(hello.worker_address.size()));
  out += hello.token;
  out += hello.host_id;
  out += hello.worker_address;
  return out;
}

absl::Status ParseHello(absl::string_view bytes, Hello* hello, bool* complete) {
  *complete = false;
  const size_t magic_seen = std::min(bytes.size(), sizeof(kMagic));
  if (std::memcmp(bytes.data(), kMagic, magic_seen) != 0) {
    return absl::InvalidArgumentError("not a shoal UCX handshake (wrong magic bytes)");
  }
  if (bytes.size() < kHelloFixedBytes) return absl::OkStatus();
  const uint32_t version = GetU32(bytes.data() + 8);
  const uint32_t token_bytes = GetU32(bytes.data() + 12);
  const uint32_t host_bytes = GetU32(bytes.data() + 16);
  const uint32_t address_bytes = GetU32(bytes.data() + 20);
  if (version != kVersion) return absl::InvalidArgumentError(absl::StrCat("handshake version ", version, " (want ", kVersion, ")"));
  if (token_bytes > kMaxTokenBytes) return absl::InvalidArgumentError(absl::StrCat("a token of ", token_bytes, " bytes"));
  if (host_bytes > kMaxHostIdBytes) return absl::InvalidArgumentError(absl::StrCat("a host id of ", host_bytes, " bytes"));
  if (address_bytes == 0 || address_bytes > kMaxWorkerAddressBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a worker address of ", address_bytes, " bytes"));
  }
  const size_t total = kHelloFixedBytes + token_bytes + host_bytes + address_bytes;
  if (bytes.size() > total) return absl::InvalidArgumentError("bytes after the handshake");
  if (bytes.size() < total) return absl::OkStatus();
  hello->token.assign(bytes.data() + kHelloFixedBytes, token_bytes);
  hello->host_id.assign(bytes.data() + kHelloFixedBytes + token_bytes, host_bytes);
  hello->worker_address.assign(bytes.data() + kHelloFixedBytes + token_bytes + host_bytes, address_bytes);
  *complete = true;
  return absl::OkStatus();
}

std::string EncodeWelcome(const Welcome& welcome) {
  const std::string message = std::string(welcome.status.message()).substr(0, kMaxMessageBytes);
  std::string out(kMagic, sizeof(kMagic));
  PutU32(&out, static_cast<uint32_t>(welcome.status.code()));
  PutU32(&out, static_cast<uint32_t>(message.size()));
  PutU32(&out, static_cast<uint32_t>(welcome.host_id.size()));
  PutU32(&out, static_cast<uint32_t>(welcome.worker_address.size()));
  PutU64(&out, welcome.connection_id);
  PutU64(&out, welcome.secret[0]);
  PutU64(&out, welcome.secret[1]);
  out += message;
  out += welcome.host_id;
  out += welcome.worker_address;
  return out;
}

absl::Status SplitHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), port) || *port < 0 ||
      *port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("address '", address, "' is not host:port"));
  }
  *host = address.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  return absl::OkStatus();
}

// The addresses `address` ("host:port") resolves to, for listening
// (`passive`: an empty host or "*" is every interface) or connecting.
using AddressList = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;
absl::StatusOr<AddressList> Resolve(const std::string& address, bool passive) {
  std::string host;
  int port = 0;
  absl::Status split = SplitHostPort(address, &host, &port);
  if (!split.ok()) return split;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const bool any = passive && (host.empty() || host == "*");
  if (getaddrinfo(any ? nullptr : host.c_str(), service.c_str(), &hints, &found) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot resolve '", host, "'"));
  }
  return AddressList(found, &freeaddrinfo);
}

absl::StatusOr<int> ListenTcp(const std::string& address, int* port) {
  absl::StatusOr<AddressList> resolved = Resolve(address, /*passive=*/true);
  if (!resolved.ok()) return absl::InvalidArgumentError(absl::StrCat("cannot listen at '", address, "': ", resolved.status().message()));
  addrinfo* found = resolved->get();
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // not SO_REUSEPORT: a busy port is an error
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) {
      sockaddr_storage bound{};
      socklen_t length = sizeof(bound);
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
      *port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      return fd;
    }
    last_error = Errno("bind");
    close(fd);
  }
  return absl::UnavailableError(absl::StrCat("cannot listen at '", address, "': ", last_error));
}

absl::StatusOr<int> ConnectAndGreet(const std::string& address, const Hello& hello, absl::Time deadline,
                                    Welcome* welcome) {
  absl::StatusOr<AddressList> resolved = Resolve(address, /*passive=*/false);
  if (!resolved.ok()) {
    if (absl::IsInvalidArgument(resolved.status())) return resolved.status();
    return absl::UnavailableError(absl::StrCat(address, " is unavailable: ", resolved.status().message()));
  }
  addrinfo* found = resolved->get();
  int fd = -1;
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int rc = connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno != EINPROGRESS) {
      last_error = Errno("connect");  // refused at once (loopback)
      close(fd);
      fd = -1;
      continue;
    }
    if (rc != 0) {
      absl::Status waited = WaitFor(fd, POLLOUT, deadline, address, "connecting");
      int error = 0;
      socklen_t length = sizeof(error);
      if (waited.ok()) getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      if (!waited.ok() || error != 0) {
        last_error = waited.ok() ? std::strerror(error) : std::string(waited.message());
        close(fd);
        fd = -1;
      }
    }
  }
  if (fd < 0) return absl::UnavailableError(absl::StrCat(address, " is unavailable: ", last_error));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const std::string bytes = EncodeHello(hello);
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      absl::Status waited = WaitFor(fd, POLLOUT, deadline, address, "sending the handshake");
      if (waited.ok()) continue;
      close(fd);
      return waited;
    }
    if (n < 0 && errno == EINTR) continue;
    const std::string error = Errno("sending the handshake");
    close(fd);
    return absl::UnavailableError(absl::StrCat(address, " is unavailable: ", error));
  }
  char fixed[kWelcomeFixedBytes];
  absl::Status status = ReadExactly(fd, fixed, sizeof(fixed), deadline, address);
  if (status.ok() && std::memcmp(fixed, kMagic, sizeof(kMagic)) != 0) {
    status = absl::UnavailableError(absl::StrCat(address, " is not a shoal UCX endpoint (wrong handshake answer)"));
  }
  const uint32_t code = status.ok() ? GetU32(fixed + 8) : 0;
  const uint32_t message_bytes = status.ok() ? GetU32(fixed + 12) : 0;
  const uint32_t host_bytes = status.ok() ? GetU32(fixed + 16) : 0;
  const uint32_t address_bytes = status.ok() ? GetU32(fixed + 20) : 0;
  if (status.ok() && (message_bytes > kMaxMessageBytes || host_bytes > kMaxHostIdBytes || address_bytes > kMaxWorkerAddressBytes || code > 16 ||
                      (code == 0 && address_bytes == 0))) {
    status = absl::UnavailableError(absl::StrCat(address, " sent a garbled handshake answer"));
  }
  std::string rest(message_bytes + host_bytes + address_bytes, '\0');
  if (status.ok()) status = ReadExactly(fd, rest.data(), rest.size(), deadline, address);
  if (!status.ok()) {
    close(fd);
    return status;
  }
  if (code != 0) {
    close(fd);
    welcome->status = absl::Status(static_cast<absl::StatusCode>(code), rest.substr(0, message_bytes));
    return welcome->status;
  }
  welcome->status = absl::OkStatus();
  welcome->connection_id = GetU64(fixed + 24);
  welcome->secret = {GetU64(fixed + 32), GetU64(fixed + 40)};
  welcome->host_id = rest.substr(message_bytes, host_bytes);
  welcome->worker_address = rest.substr(message_bytes + host_bytes);
  return fd;
}

}  // namespace shoal
