// Command-line lists shared by the collectives benchmarks (collectives.cpp,
// started_collectives.cpp): `--ranks 2,4` and `--sizes 1024,4096`.
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace bench {

/// "2,4,8" -> {2, 4, 8}; throws on anything else.
inline std::vector<long long> parseList(const char* text) {
  std::vector<long long> values;
  for (const char* cursor = text; *cursor;) {
    char* end = nullptr;
    values.push_back(std::strtoll(cursor, &end, 10));
    if (end == cursor) throw std::invalid_argument(std::string("cannot parse list '") + text + "'");
    cursor = *end == ',' ? end + 1 : end;
  }
  return values;
}

/// Stores `value` in `ranks` or `sizes` when `name` is --ranks or --sizes; false for any other.
inline bool parseRanksOrSizes(const std::string& name, const char* value, std::vector<int>& ranks,
                              std::vector<size_t>& sizes) {
  if (name == "--ranks") {
    ranks.clear();
    for (long long count : parseList(value))
      ranks.push_back(int(count));
    return true;
  }
  if (name == "--sizes") {
    sizes.clear();
    for (long long bytes : parseList(value))
      sizes.push_back(size_t(bytes));
    return true;
  }
  return false;
}

} // namespace bench
