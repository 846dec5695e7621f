// Where a worker's time goes: each phase of a step (pull, compute, push,
// waits, checkpoint saves) is a PhaseScope, timed against the worker's
// PhaseRecorder. The recorder sums every phase's own time (a wait inside a
// push counts as waiting, not as the push) for the job's summary, and, when
// they are on, puts a span on the trace and an observation in the task's
// Prometheus histograms.
//
// The recorder is per worker thread (Install); code below the strategies
// opens scopes without knowing which worker it runs for. With no recorder
// installed a scope costs a thread-local read.
#ifndef SHOAL_TELEMETRY_PHASE_H_
#define SHOAL_TELEMETRY_PHASE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>

namespace shoal {

class Tracer;

enum class Phase : int { kPull = 0, kCompute, kPush, kWait, kCheckpoint };
inline constexpr int kPhaseCount = 5;
const char* PhaseName(Phase phase);

// Called at the end of each phase with its own seconds (Prometheus).
using PhaseObserver = std::function<void(Phase phase, double seconds)>;

class PhaseRecorder {
 public:
  // `tracer` (may be null): spans on track `track`.
  PhaseRecorder(Tracer* tracer, int track, PhaseObserver observer);

  // Makes `recorder` this thread's until the returned guard ends.
  class Installed {
   public:
    explicit Installed(PhaseRecorder* recorder);
    ~Installed();
    Installed(const Installed&) = delete;
    Installed& operator=(const Installed&) = delete;

   private:
    PhaseRecorder* previous_;
  };
  static PhaseRecorder* Current();

  // The worker's local step, which its spans are tagged with.
  void SetStep(int64_t step) { step_ = step; }
  // Each phase's own seconds so far.
  double seconds(Phase phase) const { return own_ns_[static_cast<int>(phase)] / 1e9; }
  // Seconds since the recorder was made.
  double elapsed_seconds() const;

 private:
  friend class PhaseScope;
  Tracer* tracer_;
  int track_;
  PhaseObserver observer_;
  int64_t start_ns_;
  int64_t step_ = 1;
  std::array<int64_t, kPhaseCount> own_ns_{};
  class PhaseScope* open_ = nullptr;  // the innermost scope open on this thread
};

// Times one phase on this thread's recorder (none: nothing).
class PhaseScope {
 public:
  explicit PhaseScope(Phase phase);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  PhaseRecorder* const recorder_;
  Phase phase_;
  PhaseScope* parent_ = nullptr;
  int64_t start_ns_ = 0;
  int64_t nested_ns_ = 0;  // of scopes opened inside this one
};

}  // namespace shoal

#endif  // SHOAL_TELEMETRY_PHASE_H_
