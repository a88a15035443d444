// dsl-examples/moe.mesh routes every token to exactly two experts, also when gates tie (a router
// whose weights are zero gives every expert the same gate) or underflow to 0: its top1 and top2
// defs, imported by a test program and run by the reference interpreter.
#include "CompiledSource.h"
#include "interp/Interpreter.h"

#include <catch2/catch.hpp>

using namespace meshc;

namespace {

/// The example's dims: groups = 2, tokens = 64, experts = 4.
constexpr size_t kTokens = 2 * 64, kExperts = 4;

/// first/second = top2(gates) and top = top1(gates) for gates whose rows over experts are `row`.
interp::TensorMap route(const std::vector<double>& row) {
  // A file beside the example, so that the import resolves.
  testing::CompiledSource source(R"(import "moe.mesh"
program routing(gates: f32[groups, tokens, experts])
    -> (first: f32[groups, tokens, experts], second: f32[groups, tokens, experts],
        top: f32[groups, tokens, experts]) {
  first, second = top2(gates)
  top = top1(gates)
})",
                                 {}, MESHC_SOURCE_DIR "/dsl-examples/moe_routing_test.mesh");
  INFO(source.errors);
  REQUIRE(source.module);
  const ir::Function* fn = source.module->findFunction("routing");
  REQUIRE(fn);
  interp::Tensor gates{fn->inputs.at(0).type, {}};
  for (size_t t = 0; t < kTokens; ++t)
    gates.data.insert(gates.data.end(), row.begin(), row.end());
  auto outputs = interp::run(*fn, {{"gates", gates}}, {});
  if (!outputs) FAIL(llvm::toString(outputs.takeError()));
  return std::move(*outputs);
}

/// The experts each token's mask selects (one list per token).
std::vector<std::vector<size_t>> chosen(const interp::Tensor& mask) {
  REQUIRE(mask.data.size() == kTokens * kExperts);
  std::vector<std::vector<size_t>> experts(kTokens);
  for (size_t t = 0; t < kTokens; ++t)
    for (size_t e = 0; e < kExperts; ++e) {
      double value = mask.data[t * kExperts + e];
      REQUIRE((value == 0 || value == 1));
      if (value == 1) experts[t].push_back(e);
    }
  return experts;
}

} // namespace

TEST_CASE("moe routes each token to exactly two experts, ties to the lower expert", "[moe]") {
  struct Case {
    const char* what;
    std::vector<double> gates;
    size_t first, second;
  };
  for (const Case& c : {Case{"all tied (a zero router)", {0.25, 0.25, 0.25, 0.25}, 0, 1},
                        Case{"a tie for second place", {0.2, 0.4, 0.2, 0.2}, 1, 0},
                        Case{"a tie for first place", {0.1, 0.45, 0.0, 0.45}, 1, 3},
                        Case{"other gates underflowed to 0", {0.0, 0.0, 1.0, 0.0}, 2, 0},
                        Case{"no tie", {0.1, 0.2, 0.3, 0.4}, 3, 2}}) {
    INFO(c.what);
    interp::TensorMap out = route(c.gates);
    std::vector<std::vector<size_t>> first = chosen(out.at("first")),
                                     second = chosen(out.at("second")), top = chosen(out.at("top"));
    for (size_t t = 0; t < kTokens; ++t) {
      INFO("token " << t);
      CHECK(first[t] == std::vector<size_t>{c.first});
      CHECK(second[t] == std::vector<size_t>{c.second});
      CHECK(top[t] == std::vector<size_t>{c.first});
    }
  }
}
