// A trace of a job in Chrome's trace-event JSON, which Perfetto
// (ui.perfetto.dev) and chrome://tracing open: one track per worker (pull,
// forward/backward, push, waits, checkpoint saves) and one per ps task (each
// request's handling, by kind).
//
// Bounded: it keeps the spans of worker steps first_step..last_step, or of
// each worker's last `ring_steps` steps; a ps track keeps its spans while
// some worker's step is being kept, at most kMaxServerSpans of them.
#ifndef SHOAL_TELEMETRY_TRACE_H_
#define SHOAL_TELEMETRY_TRACE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace shoal {

struct TraceOptions {
  std::string path;  // where Write puts the JSON
  // Steps to keep: first..last (both counted from 1), or, when first is 0,
  // each worker's last ring_steps steps.
  int64_t first_step = 0;
  int64_t last_step = 0;
  int64_t ring_steps = 100;
};

// "A:B" (steps A to B) or "N" (the last N steps), as hooks.trace_steps reads.
absl::Status ParseTraceSteps(const std::string& text, TraceOptions* options);

class Tracer {
 public:
  static constexpr size_t kMaxServerSpans = 200000;
  explicit Tracer(TraceOptions options);

  // A track (a row in the viewer), named "worker:0" or "ps:1"; the same name
  // and kind give the same track.
  int Track(const std::string& name, bool server);
  // A span on `track`: `start_us` after the tracer began, `duration_us`
  // long; for a worker, during its local step `step`.
  void Span(int track, std::string name, int64_t start_us, int64_t duration_us, int64_t step = 0);
  // Whether a worker at local step `step` is within the steps kept.
  bool Keeps(int64_t step) const;
  // Microseconds since the tracer began (steady).
  int64_t NowMicros() const;
  // Writes the trace (to a temporary name, then renamed).
  absl::Status Write();
  const std::string& path() const { return options_.path; }

 private:
  struct SpanRecord {
    std::string name;
    int64_t start_us, duration_us, step;
  };
  struct TrackRecord {
    std::string name;
    bool server = false;
    int64_t newest_step = 0;
    std::deque<SpanRecord> spans;
  };

  const TraceOptions options_;
  const int64_t start_ns_;
  // Whether some worker's spans are being kept now: ps spans are kept while so.
  std::atomic<bool> workers_kept_{false};
  absl::Mutex mu_;
  std::vector<TrackRecord> tracks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shoal

#endif  // SHOAL_TELEMETRY_TRACE_H_
