// Point-to-point on the MPI backend: the protocol is described in MpiP2p.h.
#include "MpiP2p.h"
#include "PeerOps.h"

#include <climits>
#include <sstream>

#include <sched.h>

namespace meshrt::detail {

namespace {

using Clock = std::chrono::steady_clock;

std::string mpiErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, size_t(length));
}

} // namespace

MpiPeerOps::MpiPeerOps(MPI_Comm comm, std::vector<int> worldRanks, int groupRank,
                       std::chrono::milliseconds timeout, MpiP2pErrorFn error)
    : comm_(comm), worldRanks_(std::move(worldRanks)), groupRank_(groupRank), timeout_(timeout),
      error_(std::move(error)) {}

MpiPeerOps::~MpiPeerOps() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // Whatever is still in flight (the program failed meanwhile) is cancelled: MPI would otherwise
  // write into buffers its owner has given up.
  for (auto& [id, op] : ops_)
    if (op.request != MPI_REQUEST_NULL) {
      MPI_Cancel(&op.request);
      MPI_Request_free(&op.request);
    }
  MPI_Comm_free(&comm_);
}

uint64_t MpiPeerOps::start(const CallRecord& record, const void* sendData, void* recvData) {
  size_t bytes = size_t(record.count) * dtypeSize(record.type());
  if (bytes > size_t(INT_MAX))
    throw error_(record, std::to_string(bytes) + " bytes exceed MPI's int counts");
  uint64_t id = ++nextId_;
  Op& op = ops_.try_emplace(id).first->second;
  op.record = record;
  op.sendData = sendData;
  op.recvData = recvData;
  if (isSend(op)) {
    int code = MPI_Isend(sendData, int(bytes), MPI_BYTE, int(record.sendTo),
                         kTagBase + int(record.dtype), comm_, &op.request);
    if (code != MPI_SUCCESS) {
      ops_.erase(id);
      check(op, code, "MPI_Isend");
    }
  }
  progress();
  return id;
}

void MpiPeerOps::wait(uint64_t id) {
  auto found = ops_.find(id);
  if (found == ops_.end()) return;
  Op& op = found->second;
  Clock::time_point deadline = Clock::now() + timeout_;
  for (unsigned poll = 0; !op.done; ++poll) {
    progress();
    if (op.done) break;
    if (poll >= 100) sched_yield();
    if (poll % 64 == 0 && Clock::now() > deadline) {
      // A send that nobody receives cannot be withdrawn reliably (MPI_Cancel of a send is
      // deprecated); the job ends on this error anyway (runMpi aborts it).
      op.done = true;
      try {
        throw error_(op.record, timeoutCause(op));
      } catch (...) {
        op.failure = std::current_exception();
      }
    }
  }
  finishPeerOp(ops_, found);
}

bool MpiPeerOps::test(uint64_t id) {
  progress();
  return finishIfDone(ops_, id);
}

void MpiPeerOps::progress() {
  progressPeerOps(ops_, [this](uint64_t id, Op& op) { return step(id, op); });
}

bool MpiPeerOps::firstRecvFromPeer(uint64_t id) const {
  const Op& mine = ops_.at(id);
  for (const auto& [other, op] : ops_) {
    if (other >= id) return true;
    if (!op.done && !isSend(op) && !op.posted && peerOf(op) == peerOf(mine)) return false;
  }
  return true;
}

bool MpiPeerOps::step(uint64_t id, Op& op) {
  if (!isSend(op) && !op.posted) {
    if (!firstRecvFromPeer(id)) return false;
    int found = 0;
    MPI_Status status;
    check(op, MPI_Iprobe(peerOf(op), MPI_ANY_TAG, comm_, &found, &status), "MPI_Iprobe");
    if (!found) return false;
    int bytes = 0;
    check(op, MPI_Get_count(&status, MPI_BYTE, &bytes), "MPI_Get_count");
    int sentType = status.MPI_TAG - kTagBase;
    size_t sentSize = dtypeSize(DType(sentType)), sentCount = size_t(bytes) / sentSize;
    if (sentType != int(op.record.dtype) || sentCount != size_t(op.record.count))
      throw error_(op.record,
                   pointToPointMismatch(peerOf(op), DType(sentType), sentCount, groupRank_,
                                        op.record.type(), size_t(op.record.count)));
    // Sends from one rank on one communicator are matched in order: this Irecv takes the
    // message just probed.
    check(op,
          MPI_Irecv(op.recvData, bytes, MPI_BYTE, peerOf(op), status.MPI_TAG, comm_, &op.request),
          "MPI_Irecv");
    op.posted = true;
  }
  int done = 0;
  check(op, MPI_Test(&op.request, &done, MPI_STATUS_IGNORE), "MPI_Test");
  return done != 0;
}

void MpiPeerOps::check(const Op& op, int code, const char* function) const {
  if (code != MPI_SUCCESS)
    throw error_(op.record, std::string(function) + ": " + mpiErrorText(code));
}

std::string MpiPeerOps::timeoutCause(const Op& op) const {
  int peer = peerOf(op);
  std::ostringstream cause;
  cause << op.record.describe() << ": timed out after " << double(timeout_.count()) / 1000
        << " s: group rank " << peer << " (world rank " << worldRanks_[size_t(peer)] << ") "
        << (isSend(op) ? "did not receive it" : "sent nothing")
        << " (a rank that failed, exited or is stuck before the matching "
        << (isSend(op) ? "recv" : "send") << "; MESHRT_TIMEOUT_S sets the limit)";
  return cause.str();
}

} // namespace meshrt::detail
