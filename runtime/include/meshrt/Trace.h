// Traces: what every rank did and when, written as Chrome trace-event JSON (Perfetto and
// chrome://tracing open it), one track per rank. Recording starts when the environment names a
// file (MESHRT_TRACE=path) or a runner calls enable(path); it is written when the process exits
// (or at finish()). docs/runtime.md, "Traces", has the format.
//
// What records:
// - generated code: one Span per generated function body, one next() per op group (a fused loop
//   nest, a GEMM, a kernel call) and one site() before each collective it issues;
// - meshrt: every typed collective of Communicator (Comm.h) and wait(), named by the site the
//   generated code set last;
// - runners: a Scope around each run / train step.
// When off, a probe costs one load and one branch of a global pointer; probes sit between op
// groups, never inside a loop nest.
//
// Host code, C++17 and up (generated CUDA sources include it through Comm.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace meshrt {
class Communicator;
} // namespace meshrt

namespace meshrt::trace {

class Recorder;
/// Non-null while recording: what every probe tests first.
extern Recorder* gRecorder;

inline bool enabled() noexcept {
  return gRecorder != nullptr;
}
/// enable() and finish() are called while no rank runs (before a launch, after it returns).
/// Starts recording into `path` (replacing MESHRT_TRACE's file, if any): a process holding every
/// rank of the world writes `path`, one holding some ranks (MPI) `path.rank<R>` (R its first).
void enable(const std::string& path);
/// Writes the trace now and stops recording (also done at exit).
void finish();

/// Monotonic nanoseconds, the same clock in every process of the machine.
int64_t nowNs() noexcept;
/// Records one complete event on `comm`'s world rank. `kind`, `where` and `phase` must outlive
/// the recorder (string literals).
void record(const Communicator& comm, const char* kind, const char* where, const char* phase,
            int64_t startNs, int64_t endNs, uint64_t bytes);

/// The source location of the collective the calling thread's generated code issues next.
const char* currentSite() noexcept;
void setSite(const char* where) noexcept;

/// Called before each probe reads the clock (thread-local): on a GPU, synchronizing the device so
/// that host timestamps bracket the device work. Null: none.
using SyncHook = void (*)();
SyncHook setSyncHook(SyncHook hook) noexcept; // returns the previous one
void sync() noexcept;

/// The op groups of one generated function body: next() closes the running event and opens one
/// for the next group; site() closes it and names the collective that follows (meshrt records
/// that); the destructor closes the last.
class Span {
public:
  explicit Span(const Communicator& world) noexcept : world_(&world), on_(gRecorder != nullptr) {
    if (on_) previousSite_ = currentSite();
  }
  ~Span() {
    if (on_) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  void next(const char* kind, const char* where, const char* phase) {
    if (on_) nextSlow(kind, where, phase);
  }
  void site(const char* where) {
    if (on_) siteSlow(where);
  }

private:
  void nextSlow(const char* kind, const char* where, const char* phase);
  void siteSlow(const char* where);
  void close(int64_t now);
  void end();

  const Communicator* world_;
  bool on_;
  const char* previousSite_ = nullptr;
  const char* kind_ = nullptr; // the open event, if any
  const char* where_ = nullptr;
  const char* phase_ = nullptr;
  int64_t start_ = 0;
};

/// One event around a region: a collective (meshrt), a run or a train step (runners).
class Scope {
public:
  /// `where` null: the current site (collectives).
  Scope(const Communicator& comm, const char* kind, const char* phase, uint64_t bytes,
        const char* where = nullptr) noexcept
      : comm_(&comm), on_(gRecorder != nullptr) {
    if (on_) begin(kind, phase, bytes, where);
  }
  ~Scope() {
    if (on_) end();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

private:
  void begin(const char* kind, const char* phase, uint64_t bytes, const char* where);
  void end();

  const Communicator* comm_;
  bool on_;
  const char* kind_ = nullptr;
  const char* where_ = nullptr;
  const char* phase_ = nullptr;
  uint64_t bytes_ = 0;
  int64_t start_ = 0;
};

} // namespace meshrt::trace

/// The probes generated code prints: a Span named trace_ per function body, then one line per
/// op group or collective; a Scope around each run(). MESHRT_TRACE_PROBES_OFF compiles them out
/// (bench/trace_cost.py measures what they cost when tracing is off).
#ifdef MESHRT_TRACE_PROBES_OFF
#define MESHRT_TRACE_RUN(world, function) ((void)0)
#define MESHRT_TRACE_SPAN(world) ((void)0)
#define MESHRT_TRACE(kind, where, phase) ((void)0)
#define MESHRT_TRACE_SITE(where) ((void)0)
#else
#define MESHRT_TRACE_RUN(world, function)                                                          \
  ::meshrt::trace::Scope traceRun_(world, "run", "run", 0, function)
#define MESHRT_TRACE_SPAN(world) ::meshrt::trace::Span trace_(world)
#define MESHRT_TRACE(kind, where, phase) trace_.next(kind, where, phase)
#define MESHRT_TRACE_SITE(where) trace_.site(where)
#endif
