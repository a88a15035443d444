// The stage splits' inner modules (driver/InnerModules.h): a module derived on another mesh, or
// with recomputation, is the one loading it there makes, and derivation refuses what it cannot
// prove (a layout naming an axis, a mesh sema would report).
#include "driver/InnerModules.h"

#include "diag/Diagnostics.h"
#include "ir/IRPrinter.h"

#include <catch2/catch.hpp>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/raw_ostream.h>

using namespace meshc;

namespace {

/// The transformer example as a stage split plans it: one layer of a small block, the layout
/// searched (innerOptions' form), one function.
PipelineOptions optionsOn(const std::string& mesh) {
  PipelineOptions options;
  options.input = MESHC_SOURCE_DIR "/dsl-examples/transformer.mesh";
  options.mesh = mesh;
  options.layout = "layers: [], auto";
  options.dims = {"layers=1", "batch=8", "seq=16", "mem=16", "d_model=32", "d_ff=64"};
  options.functions = {"lm_train"};
  return options;
}

/// Everything of a module: its IR as printed, and what the printer leaves out.
std::string describe(const ir::Module& module) {
  std::string text;
  llvm::raw_string_ostream os(text);
  ir::printModule(module, os);
  os << "mesh " << module.meshName << ":";
  for (const ir::MeshAxis& axis : module.mesh)
    os << " " << axis.name << "=" << axis.size;
  os << "\nauto " << module.autoLayout << "\n";
  for (const ir::DimLayout& entry : module.layout) {
    os << entry.dim << " " << entry.isAuto << " " << entry.loc.file << ":" << entry.loc.line << ":"
       << entry.loc.col << " [";
    for (const std::string& axis : entry.axes)
      os << axis << " ";
    os << "]\n";
  }
  for (const auto& [dim, size] : module.dims)
    os << dim << "=" << size << "\n";
  for (const ir::Function& fn : module.functions)
    for (const ir::DefCall& call : fn.calls)
      os << fn.name << " " << call.def << " " << call.path << " " << call.parent << " "
         << call.recompute << "\n";
  return os.str();
}

std::string loaded(const PipelineOptions& options) {
  llvm::SourceMgr sources;
  DiagEngine diag(sources, llvm::nulls());
  std::optional<InnerModule> module = innerModule(options, nullptr, diag, "");
  REQUIRE(module);
  return describe(*module->module);
}

} // namespace

TEST_CASE("inner modules derived on another mesh and with recomputation are the loaded ones") {
  // Loading adds the sources to the engine's buffers; deriving adds none.
  llvm::SourceMgr sources;
  DiagEngine diag(sources, llvm::nulls());
  InnerModules known;
  PipelineOptions first = optionsOn("data=2,model=4");
  REQUIRE(innerModule(first, &known, diag, ""));
  REQUIRE(known.byOptions.size() == 1);
  unsigned buffers = sources.getNumBuffers();
  REQUIRE(buffers > 0);

  PipelineOptions other = optionsOn("data=4,model=2");
  std::optional<InnerModule> moved = innerModule(other, &known, diag, "");
  REQUIRE(moved);
  CHECK(sources.getNumBuffers() == buffers); // derived, not loaded
  CHECK(describe(*moved->module) == loaded(other));
  CHECK(describe(*moved->module) != loaded(first));

  PipelineOptions recomputed = optionsOn("model=8");
  recomputed.recompute = {"decoder_layer"};
  std::optional<InnerModule> derived = innerModule(recomputed, &known, diag, "");
  REQUIRE(derived);
  CHECK(sources.getNumBuffers() == buffers);
  CHECK(known.byOptions.size() == 2); // derived from the plain one, kept for other meshes
  CHECK(describe(*derived->module) == loaded(recomputed));
  PipelineOptions plainThere = optionsOn("model=8");
  CHECK(describe(*derived->module) != loaded(plainThere));
}

TEST_CASE("a module moves to a mesh only where sema would check nothing else of it") {
  llvm::SourceMgr sources;
  DiagEngine diag(sources, llvm::nulls());
  std::optional<InnerModule> module = innerModule(optionsOn("data=2,model=4"), nullptr, diag, "");
  REQUIRE(module);
  ir::Module copy = *module->module;
  CHECK(moveToMesh(copy, "data=4, model=2"));
  REQUIRE(copy.mesh.size() == 2);
  CHECK(copy.mesh[0].name == "data");
  CHECK(copy.mesh[0].size == 4);
  // Sema's errors (an axis twice, a size that is not positive, too many devices, not a name):
  // those are loaded, and reported, instead.
  for (const char* bad : {"data=2,data=4", "data=0", "data=65536,model=65536", "2d=4", "data"})
    CHECK_FALSE(moveToMesh(copy, bad));
  CHECK(copy.mesh[0].size == 4); // unchanged by a refusal
  // A layout naming an axis is checked against the mesh (known, dividing the dim).
  PipelineOptions pinned = optionsOn("data=2,model=4");
  pinned.layout = "layers: [], batch: data, auto";
  std::optional<InnerModule> pinnedModule = innerModule(pinned, nullptr, diag, "");
  REQUIRE(pinnedModule);
  ir::Module pinnedCopy = *pinnedModule->module;
  CHECK_FALSE(moveToMesh(pinnedCopy, "data=4,model=2"));
  InnerModules known;
  REQUIRE(innerModule(pinned, &known, diag, ""));
  unsigned buffers = sources.getNumBuffers();
  PipelineOptions pinnedOther = pinned;
  pinnedOther.mesh = "data=4,model=2";
  std::optional<InnerModule> reloaded = innerModule(pinnedOther, &known, diag, "");
  REQUIRE(reloaded);
  CHECK(sources.getNumBuffers() > buffers); // loaded again
  CHECK(describe(*reloaded->module) == loaded(pinnedOther));
}
