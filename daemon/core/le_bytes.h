#pragma once

// Little-endian byte encoding for the daemon's file and wire formats: one
// writer that appends fixed-width integers, byte strings and integer arrays
// to a std::string, and one reader that takes them back out of untrusted
// bytes without reading past their end. Every format of the daemon that
// stores or sends little-endian integers goes through these two classes;
// a format's own rules (bounds, error messages naming the field) wrap them.
//
// Every integer is written least significant byte first, whatever the host's
// byte order. The reader never crashes on short or hostile input: each call
// returns false (and consumes nothing) when too few bytes remain, or when a
// count it reads does not fit the bytes that follow.
//
// Compound encodings:
//   String: u32 byte count, then the bytes.
//   Array:  u32 element count, then the elements (4- or 8-byte integers,
//           each little-endian). On a little-endian host an array's
//           elements are one memcpy either way.

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

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
  // `n` zero bytes (padding).
  void Zeros(size_t n) { out_->append(n, '\0'); }
  // A String: the u32 byte count, then the bytes. The caller keeps `bytes`
  // under 4 GiB (its format's bound).
  void String(absl::string_view bytes) {
    U32(static_cast<uint32_t>(bytes.size()));
    Bytes(bytes);
  }
  // An Array: the u32 element count, then the elements. T is a 4- or 8-byte
  // integer; the caller keeps the count under 2^32.
  template <typename T>
  void Array(const std::vector<T>& values) {
    static_assert(std::is_integral_v<T> && (sizeof(T) == 4 || sizeof(T) == 8));
    U32(static_cast<uint32_t>(values.size()));
    if constexpr (std::endian::native == std::endian::little) {
      out_->append(reinterpret_cast<const char*>(values.data()),
                   values.size() * sizeof(T));
    } else {
      for (T v : values) Fixed(static_cast<uint64_t>(v), sizeof(T));
    }
  }

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
  // A String (u32 byte count, then the bytes), as a view into the input or
  // copied into *v.
  bool String(absl::string_view* v) {
    LeReader rest = *this;
    uint32_t n;
    if (!rest.U32(&n) || !rest.Bytes(n, v)) return false;
    *this = rest;
    return true;
  }
  bool String(std::string* v) {
    absl::string_view view;
    if (!String(&view)) return false;
    v->assign(view.data(), view.size());
    return true;
  }
  // A u32 count of elements that take at least `min_bytes_each` bytes each:
  // false unless they can all fit in the bytes after it, so a hostile count
  // is refused before anything is allocated for it.
  bool Count(size_t min_bytes_each, uint32_t* n) {
    LeReader rest = *this;
    uint32_t count;
    if (!rest.U32(&count) ||
        (min_bytes_each > 0 && count > rest.remaining() / min_bytes_each)) {
      return false;
    }
    *this = rest;
    *n = count;
    return true;
  }
  // `n` little-endian T (a 4- or 8-byte integer), without a count; *v is
  // replaced by them.
  template <typename T>
  bool Values(size_t n, std::vector<T>* v) {
    static_assert(std::is_integral_v<T> && (sizeof(T) == 4 || sizeof(T) == 8));
    if (n > in_.size() / sizeof(T)) return false;
    v->resize(n);
    if constexpr (std::endian::native == std::endian::little) {
      // An empty vector's data() may be null: memcpy(null, ..., 0) is UB.
      if (n > 0) std::memcpy(v->data(), in_.data(), n * sizeof(T));
      in_.remove_prefix(n * sizeof(T));
    } else {
      for (T& x : *v) {
        uint64_t u;
        Fixed(&u, sizeof(T));
        x = static_cast<T>(u);
      }
    }
    return true;
  }
  // An Array (u32 count, then the elements); *v is replaced by it.
  template <typename T>
  bool Array(std::vector<T>* v) {
    LeReader rest = *this;
    uint32_t n;
    if (!rest.Count(sizeof(T), &n) || !rest.Values(n, v)) return false;
    *this = rest;
    return true;
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
