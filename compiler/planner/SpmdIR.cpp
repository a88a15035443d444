#include "planner/SpmdIR.h"

namespace meshc::plan {

const char* collectiveName(CollectiveKind kind) {
  switch (kind) {
  case CollectiveKind::AllReduceSum:
    return "all_reduce_sum";
  case CollectiveKind::AllReduceMax:
    return "all_reduce_max";
  case CollectiveKind::AllReduceMin:
    return "all_reduce_min";
  case CollectiveKind::ReduceScatter:
    return "reduce_scatter";
  case CollectiveKind::AllGather:
    return "all_gather";
  case CollectiveKind::AllToAll:
    return "all_to_all";
  case CollectiveKind::Permute:
    return "permute";
  case CollectiveKind::LocalSlice:
    return "local_slice";
  case CollectiveKind::BucketedAllReduceSum:
    return "bucketed_all_reduce_sum";
  }
  return "?";
}

const char* phaseName(Phase phase) {
  switch (phase) {
  case Phase::Forward:
    return "forward";
  case Phase::Backward:
    return "backward";
  case Phase::Update:
    return "update";
  }
  return "?";
}

} // namespace meshc::plan
