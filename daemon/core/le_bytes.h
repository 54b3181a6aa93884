#pragma once

// Little-endian byte encoding for the daemon's file and wire formats: one
// writer that appends fixed-width integers and byte strings to a std::string,
// and one reader that takes them back out of untrusted bytes without reading
// past their end.
//
// Every integer is written least significant byte first, whatever the host's
// byte order. The reader never crashes on short or hostile input: each call
// returns false (and consumes nothing) when too few bytes remain.

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"

namespace hicache {

class LeWriter {
 public:
  // Appends to *out, which must outlive the writer.
  explicit LeWriter(std::string* out) : out_(out) {}

  void U8(uint8_t v) { out_->push_back(static_cast<char>(v)); }
  void U32(uint32_t v) { Fixed(v, 4); }
  void U64(uint64_t v) { Fixed(v, 8); }
  void I64(int64_t v) { Fixed(static_cast<uint64_t>(v), 8); }
  void Bytes(absl::string_view bytes) {
    out_->append(bytes.data(), bytes.size());
  }
  // Pads with zero bytes up to `n`.
  void Zeros(size_t n) { out_->append(n, '\0'); }

 private:
  void Fixed(uint64_t v, int width) {
    for (int i = 0; i < width; ++i) {
      out_->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    }
  }

  std::string* out_;
};

class LeReader {
 public:
  // Reads `in`, which must outlive the reader.
  explicit LeReader(absl::string_view in) : in_(in) {}

  bool U8(uint8_t* v) {
    uint64_t x;
    if (!Fixed(&x, 1)) return false;
    *v = static_cast<uint8_t>(x);
    return true;
  }
  bool U32(uint32_t* v) {
    uint64_t x;
    if (!Fixed(&x, 4)) return false;
    *v = static_cast<uint32_t>(x);
    return true;
  }
  bool U64(uint64_t* v) { return Fixed(v, 8); }
  bool I64(int64_t* v) {
    uint64_t x;
    if (!Fixed(&x, 8)) return false;
    *v = static_cast<int64_t>(x);
    return true;
  }
  // The next `n` bytes, as a view into the input.
  bool Bytes(size_t n, absl::string_view* v) {
    if (in_.size() < n) return false;
    *v = in_.substr(0, n);
    in_.remove_prefix(n);
    return true;
  }
  bool Skip(size_t n) {
    absl::string_view ignored;
    return Bytes(n, &ignored);
  }

  size_t remaining() const { return in_.size(); }

 private:
  bool Fixed(uint64_t* v, int width) {
    if (in_.size() < static_cast<size_t>(width)) return false;
    uint64_t x = 0;
    for (int i = 0; i < width; ++i) {
      x |= static_cast<uint64_t>(static_cast<uint8_t>(in_[i])) << (8 * i);
    }
    in_.remove_prefix(width);
    *v = x;
    return true;
  }

  absl::string_view in_;
};

}  // namespace hicache
