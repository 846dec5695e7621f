#include "shoal/telemetry/phase.h"

#include <chrono>

#include "shoal/telemetry/trace.h"

namespace shoal {
namespace {

thread_local PhaseRecorder* current_recorder = nullptr;

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kPull:
      return "pull";
    case Phase::kCompute:
      return "compute";
    case Phase::kPush:
      return "push";
    case Phase::kWait:
      return "wait";
    case Phase::kCheckpoint:
      return "checkpoint";
  }
  return "?";
}

PhaseRecorder::PhaseRecorder(Tracer* tracer, int track, PhaseObserver observer)
    : tracer_(tracer), track_(track), observer_(std::move(observer)), start_ns_(SteadyNanos()) {}

double PhaseRecorder::elapsed_seconds() const { return (SteadyNanos() - start_ns_) / 1e9; }

PhaseRecorder::Installed::Installed(PhaseRecorder* recorder) : previous_(current_recorder) {
  current_recorder = recorder;
}
PhaseRecorder::Installed::~Installed() { current_recorder = previous_; }
PhaseRecorder* PhaseRecorder::Current() { return current_recorder; }

PhaseScope::PhaseScope(Phase phase) : recorder_(current_recorder), phase_(phase) {
  if (recorder_ == nullptr) return;
  parent_ = recorder_->open_;
  recorder_->open_ = this;
  start_ns_ = SteadyNanos();
}

PhaseScope::~PhaseScope() {
  if (recorder_ == nullptr) return;
  const int64_t end_ns = SteadyNanos();
  const int64_t total_ns = end_ns - start_ns_;
  const int64_t own_ns = total_ns - nested_ns_;
  recorder_->own_ns_[static_cast<int>(phase_)] += own_ns;
  recorder_->open_ = parent_;
  if (parent_ != nullptr) parent_->nested_ns_ += total_ns;
  if (recorder_->observer_) recorder_->observer_(phase_, own_ns / 1e9);
  // A phase that took under a microsecond (a barrier that had nothing to
  // wait for) is no span worth drawing.
  if (Tracer* tracer = recorder_->tracer_; tracer != nullptr && total_ns >= 1000) {
    const int64_t end_us = tracer->NowMicros();
    tracer->Span(recorder_->track_, PhaseName(phase_), end_us - total_ns / 1000, total_ns / 1000, recorder_->step_);
  }
}

}  // namespace shoal
