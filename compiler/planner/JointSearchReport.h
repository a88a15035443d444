// What the joint search of a train block under a memory budget considered and chose (pipeline
// stages, recompute, microbatches, ZeRO stage; driver/JointSearch.h does the search): a section of
// --emit=plan and the `jointSearch` object of plan-json. docs/planner.md, "Joint search".
#pragma once

#include <llvm/Support/raw_ostream.h>

#include <cstdint>
#include <string>
#include <vector>

namespace meshc::plan {

/// One combination planned: its layout was searched for it (the fastest that fits without ZeRO,
/// or with a ZeRO stage the fastest regardless of memory).
struct JointCandidate {
  /// Pipeline stages over a mesh axis (1: none): `stages` consecutive groups of the repeated
  /// layers over `stageAxis`, which is the mesh axis `splitAxis` when they are the same size,
  /// else a new axis split off it (splitAxis = stage x the rest); 1F1B or GPipe as
  /// --pipeline-schedule says.
  int64_t stages = 1;
  std::string stageAxis, splitAxis;
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
