#pragma once

// Internal to //daemon/service: small conversions shared by the RPC files.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "daemon/core/le_bytes.h"
#include "daemon/layout/cp_layout.h"
#include "grpcpp/support/status.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::service {

// Tokens of one item at most (and --max_tokens_per_request per call).
inline constexpr size_t kMaxTokens = size_t{1} << 24;

inline grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

// Packed little-endian int32 tokens.
inline absl::StatusOr<std::vector<int32_t>> DecodeTokens(
    const std::string& bytes, absl::string_view field) {
  if (bytes.size() % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " has ", bytes.size(),
        " bytes; tokens are packed little-endian int32 (a multiple of 4)"));
  }
  if (bytes.size() / 4 > kMaxTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has more than ", kMaxTokens, " tokens"));
  }
  std::vector<int32_t> tokens;
  // The size was checked: this read cannot fail.
  (void)LeReader(bytes).Values(bytes.size() / 4, &tokens);
  return tokens;
}

inline void ToProto(absl::Span<const LogicalPage> pages, int64_t valid,
                    v1::Locations* out) {
  out->mutable_pages()->Add(pages.begin(), pages.end());
  out->set_valid_tokens(valid);
}

// Tokens of all items together (packed int32 bytes), checked before any is
// decoded.
template <typename Items>
grpc::Status CheckTokenBudget(const Items& items, int64_t limit) {
  int64_t tokens = 0;
  for (const auto& item : items) {
    tokens += static_cast<int64_t>(item.tokens().size() / 4);
  }
  if (tokens > limit) {
    return Invalid(absl::StrCat("the call carries ", tokens,
                                " tokens; the limit is ", limit,
                                " (--max_tokens_per_request)"));
  }
  return grpc::Status::OK;
}

}  // namespace hicache::service
