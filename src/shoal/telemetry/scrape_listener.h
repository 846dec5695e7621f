// The HTTP side of /metrics: a listener that answers `GET /metrics` with
// what a scrape function gives, one connection at a time, on a thread of
// its own.
//
// Why not prometheus-cpp's pull exposer: Debian's civetweb under it starts
// its threads with 100 KiB stacks, and in a process that has loaded
// libtorch (whose libraries' static TLS is larger) pthread_create refuses
// them, so the exposer cannot start ("Cannot create threads").
//
// Whatever arrives is hostile: a request is read up to 8 KiB within 2 s,
// only GET of /metrics is served, and with a password HTTP basic auth must
// give it (compared in constant time).
#ifndef SHOAL_TELEMETRY_SCRAPE_LISTENER_H_
#define SHOAL_TELEMETRY_SCRAPE_LISTENER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace shoal {

class ScrapeListener {
 public:
  // `bind_address`: "127.0.0.1:9100" or "0.0.0.0:9100" (port 0: the kernel
  // picks). `password` empty: no authentication.
  static absl::StatusOr<std::unique_ptr<ScrapeListener>> Start(const std::string& bind_address,
                                                               std::string password,
                                                               std::function<std::string()> scrape);
  ~ScrapeListener();
  int port() const { return port_; }

  // The answer to one request's bytes (status line, headers, body).
  std::string Answer(const std::string& request) const;

 private:
  ScrapeListener(int listen_fd, int wake_fd, int port, std::string password, std::function<std::string()> scrape);
  void Serve();
  void ServeConnection(int fd) const;

  const int listen_fd_;
  const int wake_fd_;  // an eventfd that tells Serve to end
  const int port_;
  const std::string password_;
  const std::function<std::string()> scrape_;
  std::thread thread_;
};

}  // namespace shoal

#endif  // SHOAL_TELEMETRY_SCRAPE_LISTENER_H_
