#include "client/cpp/leader_redirect.h"

#include <iterator>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace hicache::client {

absl::Status StatusOfCall(const grpc::Status& status,
                          const grpc::ClientContext& context,
                          absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  std::string message = absl::StrCat(what, ": ", status.error_message());
  std::optional<std::string> leader;
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    const auto& trailers = context.GetServerTrailingMetadata();
    const auto [begin, end] = trailers.equal_range(kLeaderTrailer);
    const auto count = std::distance(begin, end);
    if (count == 1) {
      const absl::string_view value(begin->second.data(),
                                    begin->second.size());
      if (IsValidLeaderTarget(value)) {
        leader = std::string(value);
      } else {
        absl::StrAppend(&message, " (the daemon named a leader of ",
                        value.size(),
                        " bytes that is not a valid target: not followed)");
      }
    } else if (count > 1) {
      absl::StrAppend(&message, " (the daemon named ", count,
                      " leaders: not followed)");
    }
  }
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()),
                   message);
  if (leader.has_value()) {
    out.SetPayload(kLeaderPayloadUrl, absl::Cord(*std::move(leader)));
  }
  return out;
}

std::optional<std::string> LeaderOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kLeaderPayloadUrl);
  if (!payload.has_value()) return std::nullopt;
  std::string leader(*payload);
  // A payload set by someone else is checked like a trailer.
  if (!IsValidLeaderTarget(leader)) return std::nullopt;
  return leader;
}

}  // namespace hicache::client
