#pragma once

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace hicache::testing {

// Tokens as the API carries them: packed little-endian int32 bytes.
inline std::string Pack(const std::vector<int32_t>& tokens) {
  return std::string(reinterpret_cast<const char*>(tokens.data()),
                     tokens.size() * 4);
}

// first, first + 1, ..., first + n - 1.
inline std::vector<int32_t> Seq(int32_t first, int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// a followed by b.
inline std::vector<int32_t> Cat(std::vector<int32_t> a,
                                const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace hicache::testing
