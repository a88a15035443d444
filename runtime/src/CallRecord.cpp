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
  case Collective::Send:
    return "send";
  case Collective::Recv:
    return "recv";
  case Collective::SendRecv:
    return "sendRecv";
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
  if (sendTo != Communicator::kNoPeer && collective() != Collective::Permute)
    text += " to group rank " + std::to_string(sendTo);
  if (recvFrom != Communicator::kNoPeer && collective() != Collective::Permute)
    text += " from group rank " + std::to_string(recvFrom);
  return text;
}

CallRecord pointToPoint(Collective kind, DType dtype, size_t count, int sendTo, int recvFrom,
                        bool started) {
  CallRecord record = CallRecord::of(kind, dtype, ReduceOp::Sum, count, 0, sendTo, recvFrom);
  record.started = started ? 1 : 0;
  return record;
}

std::string pointToPointMismatch(int sender, DType sentType, size_t sentCount, int receiver,
                                 DType expectedType, size_t expectedCount) {
  return "group rank " + std::to_string(sender) + " sent " + std::to_string(sentCount) + " " +
         dtypeName(sentType) + " but group rank " + std::to_string(receiver) + " expects " +
         std::to_string(expectedCount) + " " + dtypeName(expectedType) +
         " (a send and its recv must have the same count and dtype)";
}

namespace {

bool overlaps(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  auto aStart = reinterpret_cast<uintptr_t>(a), bStart = reinterpret_cast<uintptr_t>(b);
  return aBytes && bBytes && aStart < bStart + bBytes && bStart < aStart + aBytes;
}

} // namespace

std::string argumentError(const CallRecord& call, const void* in, const void* out, int ranks,
                          int rank) {
  size_t p = size_t(ranks), bytes = size_t(call.count) * dtypeSize(call.type());
  auto null = [](const void* buffer, size_t size, const char* what) {
    return !buffer && size ? std::string(what) + " is null" : std::string();
  };
  auto first = [](std::initializer_list<std::string> causes) {
    for (const std::string& cause : causes)
      if (!cause.empty()) return cause;
    return std::string();
  };
  bool reduces =
      call.collective() == Collective::AllReduce || call.collective() == Collective::ReduceScatter;
  if (reduces && call.type() == DType::Bytes) return "bytes cannot be reduced";
  switch (call.collective()) {
  case Collective::AllReduce:
    if (call.buffers) return ""; // a bucket: its buffers are checked one by one
    return first({null(in, bytes, "input"), null(out, bytes, "output"),
                  in != out && overlaps(in, bytes, out, bytes)
                      ? "input and output overlap without being the same buffer"
                      : ""});
  case Collective::ReduceScatter: {
    // As integers: a null buffer (reported here) admits no pointer arithmetic.
    uintptr_t myChunk = reinterpret_cast<uintptr_t>(in) + size_t(rank) * bytes;
    return first({null(in, bytes * p, "input"), null(out, bytes, "output"),
                  reinterpret_cast<uintptr_t>(out) != myChunk && overlaps(in, bytes * p, out, bytes)
                      ? "output overlaps the input other than as its chunk rank() (in place)"
                      : ""});
  }
  case Collective::AllGather: {
    uintptr_t myChunk = reinterpret_cast<uintptr_t>(out) + size_t(rank) * bytes;
    return first({null(in, bytes, "input"), null(out, bytes * p, "output"),
                  reinterpret_cast<uintptr_t>(in) != myChunk && overlaps(in, bytes, out, bytes * p)
                      ? "input overlaps the output other than as its chunk rank() (in place)"
                      : ""});
  }
  case Collective::AllToAll:
    return first({null(in, bytes * p, "input"), null(out, bytes * p, "output"),
                  overlaps(in, bytes * p, out, bytes * p)
                      ? "input and output overlap (allToAll has no in-place form)"
                      : ""});
  case Collective::Permute:
    for (int64_t peer : {call.sendTo, call.recvFrom})
      if (peer != Communicator::kNoPeer && (peer < 0 || peer >= ranks))
        return "peer " + std::to_string(peer) + " is not a rank of the group";
    return first({null(in, bytes, "input"), null(out, bytes, "output"),
                  overlaps(in, bytes, out, bytes)
                      ? "input and output overlap (permute has no in-place form)"
                      : ""});
  case Collective::Broadcast:
    if (call.root < 0 || call.root >= ranks)
      return "root " + std::to_string(call.root) + " is not a rank of the group";
    return null(in, bytes, "buffer");
  default:
    return "";
  }
}

std::string pointToPointError(const CallRecord& call, const void* sendData, size_t sendCount,
                              int sendTo, const void* recvData, size_t recvCount, int recvFrom,
                              int ranks, int rank) {
  size_t elementSize = dtypeSize(call.type());
  if ((call.collective() == Collective::Send && sendTo == Communicator::kNoPeer) ||
      (call.collective() == Collective::Recv && recvFrom == Communicator::kNoPeer))
    return std::string(call.name()) + " needs a peer (kNoPeer is for sendRecv)";
  for (int peer : {sendTo, recvFrom}) {
    if (peer == Communicator::kNoPeer) continue;
    if (peer < 0 || peer >= ranks)
      return "peer " + std::to_string(peer) + " is not a rank of the group (of " +
             std::to_string(ranks) + ")";
    if (peer == rank) return "peer " + std::to_string(peer) + " is this rank itself";
  }
  if (sendTo != Communicator::kNoPeer && !sendData && sendCount) return "the send buffer is null";
  if (recvFrom != Communicator::kNoPeer && !recvData && recvCount)
    return "the receive buffer is null";
  if (sendTo != Communicator::kNoPeer && recvFrom != Communicator::kNoPeer &&
      overlaps(sendData, sendCount * elementSize, recvData, recvCount * elementSize))
    return "the send and receive buffers overlap";
  return "";
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
