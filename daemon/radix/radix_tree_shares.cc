// RadixTree: namespace shares -- the pages each namespace holds, and the
// guarantees eviction keeps (docs/quotas.md).
#include "absl/strings/str_cat.h"
#include "daemon/radix/radix_tree.h"

namespace hicache {

using radix_internal::Node;

Node* RadixTree::RootOf(Node* node) {
  while (!node->is_root()) node = node->parent;
  return node;
}

const Node* RadixTree::RootOf(const Node* node) {
  while (!node->is_root()) node = node->parent;
  return node;
}

NamespacePages RadixTree::PagesOf(absl::string_view ns) const {
  auto it = roots_.find(ns);
  if (it == roots_.end()) return {};
  return {it->second->ns_device_pages, it->second->ns_host_pages};
}

std::vector<std::string> RadixTree::Namespaces() const {
  std::vector<std::string> names;
  names.reserve(roots_.size());
  for (const auto& [name, root] : roots_) names.push_back(name);
  return names;
}

void RadixTree::SetGuarantee(absl::string_view ns,
                             NamespacePages guaranteed) {
  if (guaranteed.device <= 0 && guaranteed.host <= 0) {
    guarantees_.erase(ns);
    return;
  }
  guarantees_[ns] = guaranteed;
}

bool RadixTree::InScope(const Node* node, EvictionTier tier,
                        const EvictionScope& scope, int64_t taken) const {
  if (!scope.only_ns.has_value() && guarantees_.empty()) return true;
  const Node* root = RootOf(node);
  const std::string& ns = *root->ns;
  if (scope.only_ns.has_value()) return ns == *scope.only_ns;
  if (scope.requester.has_value() && ns == *scope.requester) return true;
  auto it = guarantees_.find(ns);
  if (it == guarantees_.end()) return true;
  const bool device = tier == EvictionTier::kDevice;
  const int64_t floor = device ? it->second.device : it->second.host;
  if (floor <= 0) return true;
  const int64_t held =
      (device ? root->ns_device_pages : root->ns_host_pages) - taken;
  const int64_t pages =
      device ? static_cast<int64_t>(node->device_pages.size())
             : (node->host != nullptr ? node->host->num_pages() : 0);
  return held - pages >= floor;
}

absl::Status RadixTree::CheckTallies() const {
  for (const auto& [name, root] : roots_) {
    NamespacePages counted;
    std::vector<const Node*> stack = {root.get()};
    while (!stack.empty()) {
      const Node* node = stack.back();
      stack.pop_back();
      counted.device += static_cast<int64_t>(node->device_pages.size());
      for (const CpHostMeta* meta : {node->host.get(), node->pending.get()}) {
        if (meta != nullptr) counted.host += meta->num_pages();
      }
      for (const auto& [token, child] : node->children) {
        stack.push_back(child);
      }
    }
    const NamespacePages kept{root->ns_device_pages, root->ns_host_pages};
    if (!(counted == kept)) {
      return absl::InternalError(absl::StrCat(
          "namespace '", name, "' is tallied at ", kept.device,
          " device and ", kept.host, " host pages but holds ", counted.device,
          " and ", counted.host));
    }
  }
  return absl::OkStatus();
}

}  // namespace hicache
