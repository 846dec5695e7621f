#include "shoal/telemetry/event_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "shoal/core/crc32c.h"
#include "shoal/tensorboard.pb.h"

namespace shoal {
namespace {

void AppendLittleEndian(uint64_t value, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

std::string HostName() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

}  // namespace

uint32_t MaskedCrc32c(const void* data, size_t size) {
  const uint32_t crc = Crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string FrameRecord(const std::string& payload) {
  std::string record;
  record.reserve(payload.size() + 16);
  AppendLittleEndian(payload.size(), 8, &record);
  AppendLittleEndian(MaskedCrc32c(record.data(), 8), 4, &record);
  record += payload;
  AppendLittleEndian(MaskedCrc32c(payload.data(), payload.size()), 4, &record);
  return record;
}

absl::StatusOr<std::unique_ptr<EventFileWriter>> EventFileWriter::Create(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return absl::FailedPreconditionError(absl::StrCat("cannot create the event folder ", dir, ": ", error.message()));
  const std::string base = absl::StrCat(dir, "/events.out.tfevents.", absl::ToUnixSeconds(absl::Now()), ".", HostName());
  // A task started again within the same second keeps the older file.
  std::string path = base;
  for (int n = 1; std::filesystem::exists(path); ++n) path = absl::StrCat(base, ".", n);
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot write the event file ", path, ": ", std::strerror(errno)));
  }
  std::unique_ptr<EventFileWriter> writer(new EventFileWriter(path, file));
  tensorboard::Event header;
  header.set_wall_time(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  header.set_file_version("brain.Event:2");
  absl::MutexLock lock(&writer->mu_);
  absl::Status written = writer->WriteRecord(header.SerializeAsString());
  if (written.ok() && std::fflush(file) != 0) written = absl::DataLossError(absl::StrCat("cannot write ", path));
  if (!written.ok()) return written;
  return writer;
}

EventFileWriter::~EventFileWriter() {
  absl::MutexLock lock(&mu_);
  std::fclose(file_);
}

absl::Status EventFileWriter::WriteRecord(const std::string& payload) {
  if (failed_) return absl::OkStatus();
  const std::string record = FrameRecord(payload);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    failed_ = true;
    return absl::DataLossError(absl::StrCat("cannot write the event file ", path_, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status EventFileWriter::AddScalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  if (scalars.empty()) return absl::OkStatus();
  tensorboard::Event event;
  const absl::Time now = absl::Now();
  event.set_wall_time(absl::ToDoubleSeconds(now - absl::UnixEpoch()));
  event.set_step(step);
  for (const auto& [tag, value] : scalars) {
    tensorboard::SummaryValue* summary = event.mutable_summary()->add_value();
    summary->set_tag(tag);
    summary->set_simple_value(static_cast<float>(value));
  }
  absl::MutexLock lock(&mu_);
  absl::Status written = WriteRecord(event.SerializeAsString());
  if (written.ok() && now - last_flush_ >= absl::Seconds(1)) {
    last_flush_ = now;
    std::fflush(file_);
  }
  return written;
}

absl::Status EventFileWriter::Flush() {
  absl::MutexLock lock(&mu_);
  if (std::fflush(file_) != 0) return absl::DataLossError(absl::StrCat("cannot write the event file ", path_));
  return absl::OkStatus();
}

}  // namespace shoal
