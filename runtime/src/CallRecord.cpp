#include "CallRecord.h"

namespace meshrt::detail {

const char* collectiveName(Collective kind) {
  switch (kind) {
  case Collective::Barrier:
    return "barrier";
  case Collective::AllReduce:
    return "allReduce";
  case Collective::ReduceScatter:
    return "reduceScatter";
  case Collective::AllGather:
    return "allGather";
  case Collective::AllToAll:
    return "allToAll";
  case Collective::Permute:
    return "permute";
  case Collective::Broadcast:
    return "broadcast";
  case Collective::Subgroup:
    return "subgroup";
  }
  return "?";
}

std::string CallRecord::describe() const {
  std::string text = std::string(started ? "started " : "") + name();
  if (collective() == Collective::Barrier) return text;
  if (collective() == Collective::Subgroup) return text + " #" + std::to_string(count);
  text += " of ";
  if (buffers) text += std::to_string(buffers) + " buffers, ";
  text += std::to_string(count) + " " + dtypeName(type());
  if (collective() == Collective::AllReduce || collective() == Collective::ReduceScatter)
    text += std::string(" (") + reduceOpName(ReduceOp(op)) + ")";
  if (collective() == Collective::Broadcast) text += " from root " + std::to_string(root);
  return text;
}

std::string permuteMismatch(int ranks, const std::function<const CallRecord&(int)>& callOf) {
  auto peerName = [](int64_t rank) {
    return rank == Communicator::kNoPeer ? std::string("nobody") : "rank " + std::to_string(rank);
  };
  for (int a = 0; a < ranks; ++a) {
    const CallRecord& mine = callOf(a);
    if (mine.sendTo != Communicator::kNoPeer && callOf(int(mine.sendTo)).recvFrom != a)
      return "group rank " + std::to_string(a) + " sends to rank " + std::to_string(mine.sendTo) +
             ", which receives from " + peerName(callOf(int(mine.sendTo)).recvFrom);
    if (mine.recvFrom != Communicator::kNoPeer && callOf(int(mine.recvFrom)).sendTo != a)
      return "group rank " + std::to_string(a) + " receives from rank " +
             std::to_string(mine.recvFrom) + ", which sends to " +
             peerName(callOf(int(mine.recvFrom)).sendTo);
  }
  return "";
}

} // namespace meshrt::detail
