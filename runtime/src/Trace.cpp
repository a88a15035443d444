// Traces (meshrt/Trace.h): events buffered per rank in memory, written once as Chrome
// trace-event JSON.
#include "meshrt/Trace.h"

#include "meshrt/Comm.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace meshrt::trace {

namespace {

struct Event {
  const char* kind;
  const char* where;
  const char* phase;
  int64_t startNs, endNs;
  uint64_t bytes;
};

struct RankLog {
  std::vector<Event> events;
};

} // namespace

class Recorder {
public:
  explicit Recorder(std::string path) : path_(std::move(path)) {}

  void setPath(std::string path) {
    std::lock_guard<std::mutex> lock(mutex_);
    path_ = std::move(path);
  }
  RankLog& log(int rank, int worldSize) {
    std::lock_guard<std::mutex> lock(mutex_);
    worldSize_ = worldSize;
    std::unique_ptr<RankLog>& log = ranks_[rank];
    if (!log) {
      log = std::make_unique<RankLog>();
      log->events.reserve(4096);
    }
    return *log;
  }
  void write();

private:
  std::mutex mutex_;
  std::string path_;
  std::map<int, std::unique_ptr<RankLog>> ranks_;
  int worldSize_ = 0;
};

Recorder* gRecorder = nullptr;

namespace {

// Recorders are never freed while the process runs: a rank thread may still hold a pointer
// into one (its cached log) after finish().
std::vector<std::unique_ptr<Recorder>>& recorders() {
  static auto* all = new std::vector<std::unique_ptr<Recorder>>(); // alive at exit too
  return *all;
}

thread_local const char* tSite = nullptr;
thread_local SyncHook tSyncHook = nullptr;
// The calling thread's log: one rank per thread (threads, NCCL) or per process (MPI).
thread_local RankLog* tLog = nullptr;
thread_local const Recorder* tLogOwner = nullptr;
thread_local int tLogRank = -1;

RankLog& logOf(const Communicator& comm) {
  int rank = comm.worldRank();
  if (tLog && tLogOwner == gRecorder && tLogRank == rank) return *tLog;
  tLog = &gRecorder->log(rank, comm.worldMesh().size());
  tLogOwner = gRecorder;
  tLogRank = rank;
  return *tLog;
}

void writeJsonString(std::FILE* file, const char* text) {
  std::fputc('"', file);
  for (const char* c = text; *c; ++c) {
    if (*c == '"' || *c == '\\')
      std::fprintf(file, "\\%c", *c);
    else if (static_cast<unsigned char>(*c) < 0x20)
      std::fprintf(file, "\\u%04x", unsigned(static_cast<unsigned char>(*c)));
    else
      std::fputc(*c, file);
  }
  std::fputc('"', file);
}

/// Starts recording when the environment asks; writes the trace at exit.
struct EnvironmentAndExit {
  EnvironmentAndExit() {
    if (const char* path = std::getenv("MESHRT_TRACE"); path && *path) enable(path);
  }
  ~EnvironmentAndExit() { finish(); }
} environmentAndExit;

} // namespace

void Recorder::write() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ranks_.empty()) return;
  std::string path = path_;
  // A process holding only some ranks (MPI) writes its own file; `meshc run` merges them.
  if (int(ranks_.size()) != worldSize_) path += ".rank" + std::to_string(ranks_.begin()->first);
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (!file) {
    std::fprintf(stderr, "meshrt: cannot write the trace '%s'\n", path.c_str());
    return;
  }
  std::fprintf(file,
               "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"worldSize\": %d}, "
               "\"traceEvents\": [\n",
               worldSize_);
  bool first = true;
  auto separator = [&] {
    if (!first) std::fputs(",\n", file);
    first = false;
  };
  for (const auto& [rank, log] : ranks_) {
    // One track per rank: pid and tid are the world rank, named for the viewers.
    for (const char* name : {"process_name", "thread_name"}) {
      separator();
      std::fprintf(file,
                   "{\"name\": \"%s\", \"ph\": \"M\", \"ts\": 0, \"dur\": 0, \"pid\": %d, "
                   "\"tid\": %d, \"args\": {\"name\": \"rank %d\"}}",
                   name, rank, rank, rank);
    }
    for (const Event& event : log->events) {
      separator();
      std::string name = event.kind;
      if (event.where) name += std::string(" ") + event.where;
      std::fputs("{\"name\": ", file);
      writeJsonString(file, name.c_str());
      std::fputs(", \"cat\": ", file);
      writeJsonString(file, event.phase ? event.phase : "");
      std::fprintf(file, ", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d",
                   double(event.startNs) / 1e3, double(event.endNs - event.startNs) / 1e3, rank,
                   rank);
      std::fputs(", \"args\": {\"kind\": ", file);
      writeJsonString(file, event.kind);
      std::fputs(", \"where\": ", file);
      writeJsonString(file, event.where ? event.where : "");
      std::fprintf(file, ", \"bytes\": %llu}}", static_cast<unsigned long long>(event.bytes));
    }
  }
  std::fputs("\n]}\n", file);
  std::fclose(file);
  ranks_.clear();
}

void enable(const std::string& path) {
  if (gRecorder) {
    gRecorder->setPath(path);
    return;
  }
  recorders().push_back(std::make_unique<Recorder>(path));
  gRecorder = recorders().back().get();
}

void finish() {
  Recorder* recorder = gRecorder;
  if (!recorder) return;
  gRecorder = nullptr;
  recorder->write();
}

int64_t nowNs() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void record(const Communicator& comm, const char* kind, const char* where, const char* phase,
            int64_t startNs, int64_t endNs, uint64_t bytes) {
  if (!gRecorder) return;
  logOf(comm).events.push_back(Event{kind, where, phase, startNs, endNs, bytes});
}

const char* currentSite() noexcept {
  return tSite;
}
void setSite(const char* where) noexcept {
  tSite = where;
}

SyncHook setSyncHook(SyncHook hook) noexcept {
  SyncHook previous = tSyncHook;
  tSyncHook = hook;
  return previous;
}

void sync() noexcept {
  if (tSyncHook) tSyncHook();
}

// --- Span ---------------------------------------------------------------------------------------

void Span::close(int64_t now) {
  if (kind_) record(*world_, kind_, where_, phase_, start_, now, 0);
  kind_ = nullptr;
}

void Span::nextSlow(const char* kind, const char* where, const char* phase) {
  sync();
  int64_t now = nowNs();
  close(now);
  kind_ = kind;
  where_ = where;
  phase_ = phase;
  start_ = now;
  setSite(where);
}

void Span::siteSlow(const char* where) {
  sync();
  close(nowNs());
  setSite(where);
}

void Span::end() {
  sync();
  close(nowNs());
  setSite(previousSite_);
}

// --- Scope --------------------------------------------------------------------------------------

void Scope::begin(const char* kind, const char* phase, uint64_t bytes, const char* where) {
  sync();
  kind_ = kind;
  phase_ = phase;
  bytes_ = bytes;
  where_ = where ? where : currentSite();
  start_ = nowNs();
}

void Scope::end() {
  sync();
  record(*comm_, kind_, where_, phase_, start_, nowNs(), bytes_);
}

} // namespace meshrt::trace
