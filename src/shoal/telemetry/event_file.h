// TensorBoard event files: TensorFlow's format, written without TensorFlow.
//
// A file is a sequence of TFRecords (a little-endian uint64 length, its
// masked CRC32C, the bytes, their masked CRC32C), each an Event
// (proto/shoal/tensorboard.proto): first {file_version: "brain.Event:2"},
// then scalar summaries. TensorBoard reads the file while it grows, and a
// file cut mid-record (a killed job) loses only that record.
#ifndef SHOAL_TELEMETRY_EVENT_FILE_H_
#define SHOAL_TELEMETRY_EVENT_FILE_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shoal {

// TFRecord's checksum: CRC32C rotated and offset, so that a CRC of data that
// holds CRCs stays well spread.
uint32_t MaskedCrc32c(const void* data, size_t size);

// One record's bytes as TFRecord frames them.
std::string FrameRecord(const std::string& payload);

// Appends scalar summaries to one event file. Thread-safe.
class EventFileWriter {
 public:
  // Creates `dir` (and its parents) and, in it,
  // events.out.tfevents.<unix seconds>.<host>, with the file_version record.
  static absl::StatusOr<std::unique_ptr<EventFileWriter>> Create(const std::string& dir);
  ~EventFileWriter();

  // One Event at `step` holding every (tag, value) of `scalars`. Written
  // through to the OS at most a second after the last (Flush: now).
  absl::Status AddScalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  absl::Status Flush();
  const std::string& path() const { return path_; }

 private:
  EventFileWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  absl::Status WriteRecord(const std::string& payload) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  std::FILE* file_ ABSL_GUARDED_BY(mu_);
  absl::Time last_flush_ ABSL_GUARDED_BY(mu_) = absl::Now();
  bool failed_ ABSL_GUARDED_BY(mu_) = false;  // one error is enough: later writes are dropped
};

}  // namespace shoal

#endif  // SHOAL_TELEMETRY_EVENT_FILE_H_
