#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace hicache::metrics {

// Label values that come from clients (namespaces) must neither break the
// exposition format nor let one client create unbounded series.

// `raw` as a label value: printable ASCII is kept except '\', which becomes
// "\\"; every other byte (controls, non-ASCII, invalid UTF-8) becomes
// "\xHH". Injective, so two namespaces never share a series, and the result
// is always valid UTF-8.
std::string EscapeLabelValue(absl::string_view raw);

// One namespace's usage, as the namespace series report it.
struct NamespaceRow {
  std::string ns;  // Raw (unescaped) namespace.
  int64_t nodes = 0;
  int64_t device_tokens = 0;
  int64_t host_tokens = 0;
  int64_t sessions = 0;
  int64_t session_pages = 0;
};

// The label of the row that sums every namespace past the top N.
inline constexpr char kOtherNamespace[] = "__other__";

// Keeps the `max_rows` largest rows (device + host tokens, then session
// pages, then sessions; ties by name, so scrapes are stable) and sums the
// rest into one row named kOtherNamespace (present only when something was
// folded). A namespace literally named kOtherNamespace is always folded, so
// no two rows share a label. Returns at most max_rows + 1 rows, the kept
// ones largest first, names escaped (EscapeLabelValue).
std::vector<NamespaceRow> TopNamespaces(std::vector<NamespaceRow> rows,
                                        size_t max_rows);

}  // namespace hicache::metrics
