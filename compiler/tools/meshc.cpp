// meshc: compiles a .mesh program. All the work is in the driver library so tests can link it.
#include "driver/Driver.h"

#include <llvm/Support/InitLLVM.h>

#ifdef MESHC_WITH_JEMALLOC
// jemalloc's options, read at its start: never hand freed pages back to the system. meshc is a
// short-lived process whose searches free and allocate again all the time; returning pages and
// faulting them in again cost it as much system time as the allocations themselves save
// (docs/planner.md, "Plan time", session 21). MALLOC_CONF in the environment still overrides.
extern "C" {
const char* malloc_conf = "dirty_decay_ms:-1,muzzy_decay_ms:-1";
}
#endif

int main(int argc, char** argv) {
  llvm::InitLLVM init(argc, argv);
  return meshc::runMeshc(argc, argv);
}
