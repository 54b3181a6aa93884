#include "daemon/metrics/label_values.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_format.h"

namespace hicache::metrics {

std::string EscapeLabelValue(absl::string_view raw) {
  std::string out;
  out.reserve(raw.size());
  for (const char c : raw) {
    const unsigned char byte = static_cast<unsigned char>(c);
    if (c == '\\') {
      out += "\\\\";
    } else if (byte >= 0x20 && byte < 0x7f) {
      out += c;
    } else {
      out += absl::StrFormat("\\x%02x", byte);
    }
  }
  return out;
}

std::vector<NamespaceRow> TopNamespaces(std::vector<NamespaceRow> rows,
                                        size_t max_rows) {
  auto key = [](const NamespaceRow& r) {
    return std::make_tuple(r.device_tokens + r.host_tokens, r.session_pages,
                           r.sessions);
  };
  std::sort(rows.begin(), rows.end(),
            [&](const NamespaceRow& a, const NamespaceRow& b) {
              if (key(a) != key(b)) return key(a) > key(b);
              return a.ns < b.ns;
            });
  std::vector<NamespaceRow> out;
  NamespaceRow other;
  other.ns = kOtherNamespace;
  bool folded = false;
  for (NamespaceRow& row : rows) {
    if (out.size() < max_rows && row.ns != kOtherNamespace) {
      row.ns = EscapeLabelValue(row.ns);
      out.push_back(std::move(row));
      continue;
    }
    folded = true;
    other.nodes += row.nodes;
    other.device_tokens += row.device_tokens;
    other.host_tokens += row.host_tokens;
    other.sessions += row.sessions;
    other.session_pages += row.session_pages;
  }
  if (folded) out.push_back(std::move(other));
  return out;
}

}  // namespace hicache::metrics
