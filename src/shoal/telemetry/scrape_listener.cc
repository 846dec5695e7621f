#include "shoal/telemetry/scrape_listener.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "shoal/core/constant_time.h"

namespace shoal {
namespace {

constexpr size_t kMaxRequestBytes = 8192;
constexpr int kRequestTimeoutMs = 2000;

std::string Response(const std::string& status, const std::string& body, const std::string& extra_headers = "",
                     const std::string& content_type = "text/plain; charset=utf-8") {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type, "\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n", extra_headers, "\r\n", body);
}

// Whether the request's headers hold basic auth with `password` (any user).
bool Authorized(const std::vector<absl::string_view>& lines, const std::string& password) {
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::pair<absl::string_view, absl::string_view> header = absl::StrSplit(lines[i], absl::MaxSplits(':', 1));
    if (!absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(header.first), "authorization")) continue;
    absl::string_view value = absl::StripAsciiWhitespace(header.second);
    if (!absl::ConsumePrefix(&value, "Basic ")) return false;
    std::string decoded;
    if (!absl::Base64Unescape(absl::StripAsciiWhitespace(value), &decoded)) return false;
    const size_t colon = decoded.find(':');
    if (colon == std::string::npos) return false;
    return ConstantTimeEquals(absl::string_view(decoded).substr(colon + 1), password);
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ScrapeListener>> ScrapeListener::Start(const std::string& bind_address,
                                                                      std::string password,
                                                                      std::function<std::string()> scrape) {
  const size_t colon = bind_address.rfind(':');
  int port = -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (colon == std::string::npos || !absl::SimpleAtoi(bind_address.substr(colon + 1), &port) || port < 0 ||
      port > 65535 || inet_pton(AF_INET, bind_address.substr(0, colon).c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("'", bind_address, "' is not an IPv4 address and port"));
  }
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot listen on ", bind_address, ": ", why));
  }
  const int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  std::unique_ptr<ScrapeListener> listener(
      new ScrapeListener(fd, wake, ntohs(addr.sin_port), std::move(password), std::move(scrape)));
  listener->thread_ = std::thread([l = listener.get()] { l->Serve(); });
  return listener;
}

ScrapeListener::ScrapeListener(int listen_fd, int wake_fd, int port, std::string password,
                               std::function<std::string()> scrape)
    : listen_fd_(listen_fd), wake_fd_(wake_fd), port_(port), password_(std::move(password)), scrape_(std::move(scrape)) {}

ScrapeListener::~ScrapeListener() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(wake_fd_);
}

void ScrapeListener::Serve() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    const int connection = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    ServeConnection(connection);
    close(connection);
  }
}

void ScrapeListener::ServeConnection(int fd) const {
  // The request, up to its blank line, within the size and time bounds.
  std::string request;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kRequestTimeoutMs);
  char buffer[1024];
  while (request.find("\r\n\r\n") == std::string::npos) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    pollfd in = {fd, POLLIN, 0};
    pollfd wake = {wake_fd_, POLLIN, 0};
    pollfd fds[2] = {in, wake};
    if (left <= 0 || poll(fds, 2, static_cast<int>(left)) <= 0 || fds[1].revents != 0) return;
    const ssize_t got = read(fd, buffer, sizeof(buffer));
    if (got <= 0) return;
    request.append(buffer, static_cast<size_t>(got));
    if (request.size() > kMaxRequestBytes) {
      request = "";
      break;
    }
  }
  const std::string answer = request.empty() ? Response("431 Request Header Fields Too Large", "request too large\n")
                                             : Answer(request);
  size_t sent = 0;
  while (sent < answer.size()) {
    const ssize_t n = send(fd, answer.data() + sent, answer.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

std::string ScrapeListener::Answer(const std::string& request) const {
  const std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(request).substr(0, request.find("\r\n\r\n")), "\r\n");
  const std::vector<absl::string_view> words = absl::StrSplit(lines[0], ' ');
  if (words.size() != 3 || !absl::StartsWith(words[2], "HTTP/1.")) return Response("400 Bad Request", "bad request\n");
  if (words[0] != "GET") return Response("405 Method Not Allowed", "only GET\n", "Allow: GET\r\n");
  const absl::string_view path = words[1].substr(0, words[1].find('?'));
  if (path != "/metrics") return Response("404 Not Found", "metrics are at /metrics\n");
  if (!password_.empty() && !Authorized(lines, password_)) {
    return Response("401 Unauthorized", "give the job's token as the basic-auth password\n",
                    "WWW-Authenticate: Basic realm=\"shoal\"\r\n");
  }
  return Response("200 OK", scrape_(), "", "text/plain; version=0.0.4; charset=utf-8");
}

}  // namespace shoal
