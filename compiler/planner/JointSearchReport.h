// What the joint search of a train block under a memory budget considered and chose (recompute,
// microbatches, ZeRO stage; driver/JointSearch.h does the search): a section of --emit=plan and
// the `jointSearch` object of plan-json. docs/planner.md, "Joint search".
#pragma once

#include <llvm/Support/raw_ostream.h>

#include <cstdint>
#include <string>
#include <vector>

namespace meshc::plan {

/// One combination planned: its layout was searched for it (the fastest that fits without ZeRO,
/// or with a ZeRO stage the fastest regardless of memory).
struct JointCandidate {
  std::string recompute;    // the def whose calls are recomputed ("" none)
  int64_t microbatches = 1; // per step, along JointSearchReport::microbatchDim
  int zeroStage = 0;
  double stepSeconds = 0; // the whole step's (every microbatch)
  double memoryBytes = 0; // per device
  bool fits = false;
};

struct JointSearchReport {
  double budgetBytes = 0;
  double plainMemoryBytes = 0; // the smallest layout without any of them (0: none was planned)
  std::string microbatchDim;   // "" when the block has no dim to microbatch
  std::vector<JointCandidate> considered; // in the order planned
  int chosen = -1;                        // index into considered
  std::vector<std::string> notTried;      // combinations left out, each with the reason
};

/// "recompute decoder_layer, 8 microbatches of batch, ZeRO stage 3" ("nothing" for none).
std::string jointChoiceText(const JointCandidate& candidate, const std::string& microbatchDim);

/// The --emit=plan section.
void printJointSearch(const JointSearchReport& report, llvm::raw_ostream& os);

} // namespace meshc::plan
