#include "shoal/transport/transport.h"

#include "absl/synchronization/notification.h"

namespace shoal {

absl::Status CallAndWait(Channel& channel, const Request& request, Response* response, absl::Time deadline) {
  absl::Notification finished;
  absl::Status result;
  channel.Call(request, response, deadline, [&](absl::Status status) {
    result = std::move(status);
    finished.Notify();
  });
  finished.WaitForNotification();  // the transport enforces the deadline
  return result;
}

}  // namespace shoal
