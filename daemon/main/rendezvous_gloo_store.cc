#include "daemon/main/rendezvous_gloo_store.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/common/error.h"

namespace hicache {
namespace {

[[noreturn]] void Throw(absl::string_view what, const absl::Status& s) {
  throw gloo::IoException(
      absl::StrCat("CP group rendezvous ", what, ": ", s.ToString()));
}

}  // namespace

void RendezvousGlooStore::set(const std::string& key,
                              const std::vector<char>& data) {
  absl::Status s = Set(key, std::string(data.begin(), data.end()));
  if (!s.ok()) Throw(absl::StrCat("set \"", absl::CHexEscape(key), "\""), s);
}

std::vector<char> RendezvousGlooStore::get(const std::string& key) {
  absl::StatusOr<std::string> value = Get(key, timeout_);
  if (!value.ok()) {
    Throw(absl::StrCat("get \"", absl::CHexEscape(key), "\""), value.status());
  }
  return std::vector<char>(value->begin(), value->end());
}

void RendezvousGlooStore::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::duration_cast<std::chrono::milliseconds>(
                 absl::ToChronoMilliseconds(timeout_)));
}

void RendezvousGlooStore::wait(const std::vector<std::string>& keys,
                               const std::chrono::milliseconds& timeout) {
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  for (const std::string& key : keys) {
    absl::StatusOr<std::string> value = Get(key, deadline - absl::Now());
    if (value.ok()) continue;
    if (value.status().code() == absl::StatusCode::kNotFound) {
      // FileStore's message, so logs read alike whatever the store.
      throw gloo::IoException(absl::StrCat(
          "Wait timeout for key(s): ", absl::StrJoin(keys, " "),
          " (CP group rendezvous: ", value.status().message(), ")"));
    }
    Throw(absl::StrCat("wait for \"", absl::CHexEscape(key), "\""),
          value.status());
  }
}

}  // namespace hicache
