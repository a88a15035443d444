// The tensor file format that generated runners read (inputs) and write (outputs), and that
// `meshc run` reads: per tensor a text line "tensor <name> <dtype> <rank> <sizes...>\n" followed
// by product(sizes) little-endian float64 values. Such files may come from elsewhere, so the
// parser checks each header against the bytes that follow before anyone allocates for it: a
// malformed or lying file is a std::runtime_error naming the file (and the tensor), never a
// crash or a huge allocation. Standard library only: generated code and the driver include it.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace meshc::gen {

/// One tensor of a tensor file; `values` points into the parsed bytes.
struct TensorFileEntry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string_view values; // count() float64s, little-endian

  size_t count() const { return values.size() / sizeof(double); }
  double value(size_t i) const {
    double v;
    std::memcpy(&v, values.data() + i * sizeof(double), sizeof(double));
    return v;
  }
};

/// The tensors of file `path` (named in errors) whose contents are `bytes`, in file order.
/// Throws std::runtime_error on a malformed header, a rank over 64, a negative size, or a header
/// declaring more values than follow it.
inline std::vector<TensorFileEntry> parseTensorFile(std::string_view bytes,
                                                    const std::string& path) {
  std::vector<TensorFileEntry> entries;
  while (!bytes.empty()) {
    size_t end = bytes.find('\n');
    std::string_view line = bytes.substr(0, end);
    auto malformed = [&] {
      return std::runtime_error("'" + path + "' is not a tensor file (at '" + std::string(line) +
                                "')");
    };
    if (end == std::string_view::npos) throw malformed(); // a header cut short
    bytes.remove_prefix(end + 1);
    std::vector<std::string_view> fields;
    for (size_t at = 0; at < line.size();) {
      size_t next = line.find_first_of(" \t\r", at);
      if (next == std::string_view::npos) next = line.size();
      if (next > at) fields.push_back(line.substr(at, next - at));
      at = next + 1;
    }
    auto integer = [&](std::string_view field, int64_t& out) {
      auto [rest, error] = std::from_chars(field.data(), field.data() + field.size(), out);
      return error == std::errc() && rest == field.data() + field.size();
    };
    int64_t rank = -1;
    if (fields.size() < 4 || fields[0] != "tensor" || !integer(fields[3], rank) || rank < 0 ||
        rank > 64 || fields.size() != size_t(4 + rank))
      throw malformed();
    TensorFileEntry entry{std::string(fields[1]), std::string(fields[2]), {}, {}};
    // The count in checked arithmetic: a product of sizes may overflow 64 bits.
    uint64_t count = 1;
    bool overflows = false;
    for (int64_t d = 0; d < rank; ++d) {
      int64_t size = -1;
      if (!integer(fields[size_t(4 + d)], size) || size < 0) throw malformed();
      entry.shape.push_back(size);
      overflows = overflows || __builtin_mul_overflow(count, uint64_t(size), &count);
    }
    size_t available = bytes.size() / sizeof(double);
    if (overflows || count > available) {
      std::string shape = "[";
      for (size_t d = 0; d < entry.shape.size(); ++d)
        shape += (d ? ", " : "") + std::to_string(entry.shape[d]);
      throw std::runtime_error("inputs file '" + path + "': tensor '" + entry.name +
                               "' declares shape " + shape + "] but only " +
                               std::to_string(available) + " values follow in the file");
    }
    entry.values = bytes.substr(0, size_t(count) * sizeof(double));
    bytes.remove_prefix(entry.values.size());
    entries.push_back(std::move(entry));
  }
  return entries;
}

} // namespace meshc::gen
