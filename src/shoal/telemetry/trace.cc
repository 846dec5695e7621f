#include "shoal/telemetry/trace.h"

#include <unistd.h>

#include <chrono>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "shoal/core/file.h"

namespace shoal {
namespace {

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::Status ParseTraceSteps(const std::string& text, TraceOptions* options) {
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  int64_t a = 0, b = 0;
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat("config: 'hooks.trace_steps' is '", text,
                                                   "': give A:B (steps A to B, from 1) or N (each worker's last N steps)"));
  };
  if (parts.size() == 1) {
    if (!absl::SimpleAtoi(parts[0], &a) || a <= 0) return bad();
    options->first_step = options->last_step = 0;
    options->ring_steps = a;
    return absl::OkStatus();
  }
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &a) || !absl::SimpleAtoi(parts[1], &b) || a < 1 || b < a) {
    return bad();
  }
  options->first_step = a;
  options->last_step = b;
  return absl::OkStatus();
}

Tracer::Tracer(TraceOptions options) : options_(std::move(options)), start_ns_(SteadyNanos()) {}

int64_t Tracer::NowMicros() const { return (SteadyNanos() - start_ns_) / 1000; }

int Tracer::Track(const std::string& name, bool server) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < tracks_.size(); ++i) {
    if (tracks_[i].name == name && tracks_[i].server == server) return static_cast<int>(i);
  }
  tracks_.push_back(TrackRecord{name, server, 0, {}});
  return static_cast<int>(tracks_.size()) - 1;
}

bool Tracer::Keeps(int64_t step) const {
  if (options_.first_step > 0) return step >= options_.first_step && step <= options_.last_step;
  return true;  // the ring drops the older ones
}

void Tracer::Span(int track, std::string name, int64_t start_us, int64_t duration_us, int64_t step) {
  absl::MutexLock lock(&mu_);
  if (track < 0 || track >= static_cast<int>(tracks_.size())) return;
  TrackRecord& t = tracks_[track];
  if (t.server) {
    if (!workers_kept_.load(std::memory_order_relaxed)) return;
    if (t.spans.size() >= kMaxServerSpans) t.spans.pop_front();
  } else {
    const bool kept = Keeps(step);
    workers_kept_.store(kept || (options_.first_step == 0), std::memory_order_relaxed);
    if (!kept) return;
    t.newest_step = std::max(t.newest_step, step);
    if (options_.first_step == 0) {
      while (!t.spans.empty() && t.spans.front().step <= t.newest_step - options_.ring_steps) t.spans.pop_front();
    }
  }
  t.spans.push_back(SpanRecord{std::move(name), start_us, duration_us, step});
}

absl::Status Tracer::Write() {
  nlohmann::json events = nlohmann::json::array();
  const int pid = static_cast<int>(getpid());
  {
    absl::MutexLock lock(&mu_);
    // With a ring, ps spans older than the oldest kept worker step are
    // left out, so the tracks cover the same time.
    int64_t kept_from_us = -1;
    for (const TrackRecord& t : tracks_) {
      if (t.server || t.spans.empty()) continue;
      kept_from_us = kept_from_us < 0 ? t.spans.front().start_us : std::min(kept_from_us, t.spans.front().start_us);
    }
    for (size_t i = 0; i < tracks_.size(); ++i) {
      const TrackRecord& t = tracks_[i];
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", i}, {"args", {{"name", t.name}}}});
      events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", pid}, {"tid", i},
                        {"args", {{"sort_index", i}}}});
      for (const SpanRecord& s : t.spans) {
        if (t.server && s.start_us + s.duration_us < kept_from_us) continue;
        nlohmann::json event = {{"ph", "X"}, {"name", s.name}, {"cat", t.server ? "ps" : "worker"}, {"pid", pid},
                                {"tid", i},  {"ts", s.start_us}, {"dur", s.duration_us}};
        if (!t.server) event["args"] = {{"step", s.step}};
        events.push_back(std::move(event));
      }
    }
  }
  const nlohmann::json trace = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return WriteTextFile(options_.path, trace.dump());
}

}  // namespace shoal
