// A TCP proxy on loopback in front of one server, for tests of slow and
// briefly cut links: it forwards both ways, holds back what the server sends
// by `reply_delay`, and can cut every connection and refuse new ones for a
// while (a blip), as a flaky network between tasks would.
#ifndef SHOAL_TESTS_TCP_PROXY_H_
#define SHOAL_TESTS_TCP_PROXY_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <string>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shoal {

class TcpProxy {
 public:
  // Listens on 127.0.0.1:`listen_port` and forwards to 127.0.0.1:`target_port`.
  TcpProxy(int listen_port, int target_port, absl::Duration reply_delay = absl::ZeroDuration())
      : target_port_(target_port), reply_delay_(reply_delay) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr = Loopback(listen_port);
    ok_ = bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(listener_, 64) == 0;
    if (ok_) threads_.emplace_back([this] { AcceptLoop(); });
  }
  ~TcpProxy() {
    stop_ = true;
    for (auto& t : threads_) t.join();
    close(listener_);
  }
  bool ok() const { return ok_; }

  // Breaks every open connection now, and turns new ones away (accepts and
  // closes them) for `how_long`.
  void Cut(absl::Duration how_long) {
    std::lock_guard lock(mu_);
    cut_until_ = absl::Now() + how_long;
    for (const auto& weak : links_) {
      if (auto link = weak.lock(); link && !link->broken) {
        link->Break();
        ++broken_;
      }
    }
  }
  // Connections broken or turned away by cuts so far.
  int broken() const { return broken_.load(); }

 private:
  // One proxied connection; its sockets close when both directions are done.
  struct Link {
    int client = -1, server = -1;
    std::atomic<bool> broken{false};
    void Break() {
      broken = true;
      shutdown(client, SHUT_RDWR);
      shutdown(server, SHUT_RDWR);
    }
    ~Link() {
      close(client);
      close(server);
    }
  };

  static sockaddr_in Loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return addr;
  }

  void AcceptLoop() {
    std::vector<std::thread> pumps;
    while (!stop_) {
      pollfd waiting{listener_, POLLIN, 0};
      if (poll(&waiting, 1, 50) <= 0) continue;
      const int client = accept(listener_, nullptr, nullptr);
      if (client < 0) continue;
      bool refuse;
      {
        std::lock_guard lock(mu_);
        refuse = absl::Now() < cut_until_;
      }
      if (refuse) {
        ++broken_;
        close(client);
        continue;
      }
      auto link = std::make_shared<Link>();
      link->client = client;
      link->server = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in target = Loopback(target_port_);
      if (connect(link->server, reinterpret_cast<sockaddr*>(&target), sizeof(target)) != 0) continue;
      {
        std::lock_guard lock(mu_);
        links_.push_back(link);
      }
      pumps.emplace_back([this, link] { Pump(link, link->client, link->server, absl::ZeroDuration()); });
      pumps.emplace_back([this, link] { Pump(link, link->server, link->client, reply_delay_); });
    }
    for (auto& t : pumps) t.join();
  }

  // Copies `from` to `to`, each chunk `delay` after it arrived (a link
  // with that latency: chunks in flight overlap), until either side closes
  // or the link is broken.
  void Pump(const std::shared_ptr<Link>& link, int from, int to, absl::Duration delay) {
    std::deque<std::pair<absl::Time, std::string>> in_flight;
    std::vector<char> buffer(1 << 16);
    bool open = true;
    while (!stop_ && !link->broken && (open || !in_flight.empty())) {
      const absl::Duration until_due =
          in_flight.empty() ? absl::Milliseconds(50)
                            : std::max(absl::ZeroDuration(), in_flight.front().first + delay - absl::Now());
      pollfd readable{from, static_cast<short>(open ? POLLIN : 0), 0};
      if (poll(&readable, 1, static_cast<int>(absl::ToInt64Milliseconds(until_due))) > 0) {
        const ssize_t n = read(from, buffer.data(), buffer.size());
        if (n <= 0) {
          open = false;
        } else {
          in_flight.emplace_back(absl::Now(), std::string(buffer.data(), n));
        }
      }
      while (!in_flight.empty() && in_flight.front().first + delay <= absl::Now()) {
        const std::string& chunk = in_flight.front().second;
        for (size_t sent = 0; sent < chunk.size();) {
          const ssize_t k = send(to, chunk.data() + sent, chunk.size() - sent, MSG_NOSIGNAL);
          if (k <= 0) {
            link->broken = true;
            break;
          }
          sent += static_cast<size_t>(k);
        }
        in_flight.pop_front();
      }
    }
    link->Break();
  }

  const int target_port_;
  const absl::Duration reply_delay_;
  int listener_ = -1;
  bool ok_ = false;
  std::atomic<bool> stop_{false};
  std::atomic<int> broken_{0};
  std::mutex mu_;
  absl::Time cut_until_ = absl::InfinitePast();
  std::vector<std::weak_ptr<Link>> links_;
  std::vector<std::thread> threads_;
};

}  // namespace shoal

#endif  // SHOAL_TESTS_TCP_PROXY_H_
