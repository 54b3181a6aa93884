#pragma once

// FieldCount<T>(): the number of fields of the aggregate T, so that a test can
// notice a field added to an options struct that a conversion must carry.
//
// T{f1, ..., fN} compiles for N up to the number of fields; each `AnyField`
// converts to any field's type. REQUIRES: no field of T is itself an
// aggregate (brace elision would count its members) and no field has a
// constructor that takes any argument (a template converting constructor).

#include <cstddef>
#include <utility>

namespace hicache::testing {

struct AnyField {
  template <typename T>
  constexpr operator T&() const&& noexcept;  // NOLINT: declared only.
};

template <typename T, size_t... I>
constexpr bool BraceConstructible(std::index_sequence<I...>) {
  return requires { T{(static_cast<void>(I), AnyField{})...}; };
}

template <typename T, size_t N = 0>
constexpr size_t FieldCount() {
  if constexpr (!BraceConstructible<T>(std::make_index_sequence<N + 1>{})) {
    return N;
  } else {
    return FieldCount<T, N + 1>();
  }
}

}  // namespace hicache::testing
