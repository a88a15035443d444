// The backend-independent parts of the communicator interface: meshes, dtypes, the timeout.
#include "meshrt/Comm.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace meshrt {

Mesh::Mesh(std::vector<MeshAxis> axes) : axes_(std::move(axes)) {
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (axes_[i].name.empty())
      throw std::invalid_argument("meshrt: mesh axis " + std::to_string(i) + " has no name");
    if (axes_[i].size < 1)
      throw std::invalid_argument("meshrt: mesh axis '" + axes_[i].name + "' has size " +
                                  std::to_string(axes_[i].size) + " (must be at least 1)");
    for (size_t j = 0; j < i; ++j)
      if (axes_[j].name == axes_[i].name)
        throw std::invalid_argument("meshrt: mesh axis '" + axes_[i].name + "' appears twice");
  }
}

static std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t'))
    text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t'))
    text.remove_suffix(1);
  return text;
}

Mesh Mesh::parse(std::string_view text) {
  std::vector<MeshAxis> axes;
  if (trim(text).empty()) return Mesh();
  while (true) {
    size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    size_t equals = item.find('=');
    std::string_view name = trim(item.substr(0, equals));
    std::string_view size = equals == std::string_view::npos ? "" : trim(item.substr(equals + 1));
    int value = 0;
    auto [end, error] = std::from_chars(size.data(), size.data() + size.size(), value);
    if (equals == std::string_view::npos || error != std::errc() ||
        end != size.data() + size.size())
      throw std::invalid_argument("meshrt: cannot parse mesh axis '" + std::string(trim(item)) +
                                  "' (expected name=size)");
    axes.push_back({std::string(name), value});
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return Mesh(std::move(axes));
}

int Mesh::size() const {
  int product = 1;
  for (const MeshAxis& axis : axes_)
    product *= axis.size;
  return product;
}

int Mesh::axisIndex(std::string_view name) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name == name) return int(i);
  return -1;
}

int Mesh::axisSize(std::string_view name) const {
  int index = axisIndex(name);
  if (index < 0)
    throw std::invalid_argument("meshrt: mesh " + str() + " has no axis '" + std::string(name) +
                                "'");
  return axes_[index].size;
}

std::vector<int> Mesh::coords(int rank) const {
  if (rank < 0 || rank >= size())
    throw std::out_of_range("meshrt: rank " + std::to_string(rank) + " is not in mesh " + str());
  std::vector<int> result(axes_.size());
  for (size_t i = axes_.size(); i-- > 0;) {
    result[i] = rank % axes_[i].size;
    rank /= axes_[i].size;
  }
  return result;
}

int Mesh::rank(const std::vector<int>& coords) const {
  if (coords.size() != axes_.size())
    throw std::out_of_range("meshrt: " + std::to_string(coords.size()) + " coordinates for mesh " +
                            str());
  int result = 0;
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (coords[i] < 0 || coords[i] >= axes_[i].size)
      throw std::out_of_range("meshrt: coordinate " + std::to_string(coords[i]) + " of axis '" +
                              axes_[i].name + "' is outside mesh " + str());
    result = result * axes_[i].size + coords[i];
  }
  return result;
}

std::string Mesh::str() const {
  std::string result = "[";
  for (size_t i = 0; i < axes_.size(); ++i)
    result += (i ? ", " : "") + axes_[i].name + "=" + std::to_string(axes_[i].size);
  return result + "]";
}

size_t dtypeSize(DType dtype) {
  switch (dtype) {
  case DType::F32:
    return 4;
  case DType::F64:
    return 8;
  case DType::I32:
    return 4;
  case DType::Bytes:
    return 1;
  }
  return 1;
}

const char* dtypeName(DType dtype) {
  switch (dtype) {
  case DType::F32:
    return "f32";
  case DType::F64:
    return "f64";
  case DType::I32:
    return "i32";
  case DType::Bytes:
    return "bytes";
  }
  return "?";
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum:
    return "sum";
  case ReduceOp::Max:
    return "max";
  case ReduceOp::Min:
    return "min";
  }
  return "?";
}

std::chrono::milliseconds defaultTimeout() {
  const char* text = std::getenv("MESHRT_TIMEOUT_S");
  if (!text || !*text) return std::chrono::seconds(60);
  char* end = nullptr;
  errno = 0;
  double seconds = std::strtod(text, &end);
  if (errno || *end || !std::isfinite(seconds) || seconds <= 0 || seconds > 1e9)
    throw std::invalid_argument(std::string("meshrt: MESHRT_TIMEOUT_S='") + text +
                                "' is not a positive number of seconds");
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(seconds * 1000)));
}

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    finishQuietly();
    owner_ = other.owner_;
    ticket_ = other.ticket_;
    other.owner_ = nullptr;
  }
  return *this;
}

bool Request::pending() const {
  return owner_ && owner_->completedThrough() < ticket_;
}

void Request::wait() {
  if (owner_) owner_->wait(*this);
}

bool Request::test() {
  return owner_ ? owner_->test(*this) : true;
}

void Request::finishQuietly() noexcept {
  if (!pending()) return;
  try {
    owner_->wait(*this);
  } catch (...) {
    // The backend has recorded the failure (the world or the communicator has failed): the
    // rank's next call reports it. A destructor cannot.
  }
  owner_ = nullptr;
}

static void checkOwner(const Communicator& self, const Request& request) {
  if (request.owner() != &self)
    throw std::invalid_argument("meshrt: wait/test on a communicator (group " + self.mesh().str() +
                                ") that did not start the request");
}

void Communicator::wait(Request& request) {
  if (!request.owner_) return;
  checkOwner(*this, request);
  request.owner_ = nullptr; // finished whether it completes or fails
  trace::Scope probe(*this, "wait", kCollective, 0);
  waitRaw(request.ticket_);
}

bool Communicator::test(Request& request) {
  if (!request.owner_) return true;
  checkOwner(*this, request);
  bool done = false;
  try {
    done = testRaw(request.ticket_);
  } catch (...) {
    request.owner_ = nullptr;
    throw;
  }
  if (done) request.owner_ = nullptr;
  return done;
}

int Communicator::coord(std::string_view axis) const {
  int index = mesh().axisIndex(axis);
  if (index < 0)
    throw std::invalid_argument("meshrt: communicator mesh " + mesh().str() + " has no axis '" +
                                std::string(axis) + "'");
  return coords()[index];
}

std::pair<int, int> Communicator::shiftPeers(int offset, Boundary boundary) const {
  int groupSize = size(), self = rank();
  long long sendTo = (long long)self + offset, recvFrom = (long long)self - offset;
  if (boundary == Boundary::Wrap) {
    auto wrap = [&](long long value) { return int(((value % groupSize) + groupSize) % groupSize); };
    return {wrap(sendTo), wrap(recvFrom)};
  }
  auto inside = [&](long long value) {
    return value >= 0 && value < groupSize ? int(value) : kNoPeer;
  };
  return {inside(sendTo), inside(recvFrom)};
}

} // namespace meshrt
