// meshc: compiles a .mesh program. All the work is in the driver library so tests can link it.
#include "driver/Driver.h"

#include <llvm/Support/InitLLVM.h>

int main(int argc, char** argv) {
  llvm::InitLLVM init(argc, argv);
  return meshc::runMeshc(argc, argv);
}
