// The UCX transport's handshake, over a plain TCP socket that then stays
// open as the connection's liveness signal.
//
//   client -> server  Hello:   "SHOALUCX" u32 version, u32 token length,
//                               u32 host id length, u32 address length,
//                               token, host id, UCX worker address
//   server -> client  Welcome: "SHOALUCX" u32 status code, u32 message length,
//                               u32 host id length, u32 address length,
//                               u64 connection id, 16-byte secret, message,
//                               host id, UCX worker address
//
// The host id (HostId()) tells two tasks whether they share a machine and
// network namespace, and so whether UCX may use shared memory between them.
//
// All integers little-endian. Lengths are checked against small limits
// before anything is allocated: the server reads at most kMaxHelloBytes.
#ifndef SHOAL_TRANSPORT_UCX_HANDSHAKE_H_
#define SHOAL_TRANSPORT_UCX_HANDSHAKE_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace shoal {

inline constexpr size_t kMaxTokenBytes = 4096;
inline constexpr size_t kMaxWorkerAddressBytes = 64 << 10;
inline constexpr size_t kMaxHostIdBytes = 256;
inline constexpr size_t kHelloFixedBytes = 8 + 4 + 4 + 4 + 4;
inline constexpr size_t kMaxHelloBytes = kHelloFixedBytes + kMaxTokenBytes + kMaxHostIdBytes + kMaxWorkerAddressBytes;

struct Hello {
  std::string token;
  std::string host_id;
  std::string worker_address;
};

using ConnectionSecret = std::array<uint64_t, 2>;

struct Welcome {
  absl::Status status;  // not OK: the server refused (the token), and says why
  uint64_t connection_id = 0;
  ConnectionSecret secret{};
  std::string host_id;
  std::string worker_address;
};

std::string EncodeHello(const Hello& hello);
// Parses a Hello from the bytes received so far: OK and `*complete` once
// whole, OK and not complete while more may come, an error when the bytes
// cannot be one (wrong magic or version, a length over its limit).
absl::Status ParseHello(absl::string_view bytes, Hello* hello, bool* complete);

std::string EncodeWelcome(const Welcome& welcome);

// "host:port" -> host and port; a bracketed IPv6 host loses its brackets.
absl::Status SplitHostPort(const std::string& address, std::string* host, int* port);

// A listening TCP socket at `address` (port 0: any free one, written to
// `*port`), non-blocking.
absl::StatusOr<int> ListenTcp(const std::string& address, int* port);

// Connects to `address`, sends `hello` and reads the Welcome, all before
// `deadline`. Returns the connected socket (the caller closes it) and the
// Welcome. Failures are Unavailable or DeadlineExceeded and say what failed.
absl::StatusOr<int> ConnectAndGreet(const std::string& address, const Hello& hello, absl::Time deadline,
                                    Welcome* welcome);

// This machine's boot id and this process's network namespace: equal for
// two processes that can share memory and see the same network.
std::string HostId();

}  // namespace shoal

#endif  // SHOAL_TRANSPORT_UCX_HANDSHAKE_H_
