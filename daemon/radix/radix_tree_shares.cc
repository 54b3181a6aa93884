// RadixTree: namespace shares -- the pages each namespace holds, and the
// guarantees eviction keeps (docs/quotas.md).
#include "absl/container/flat_hash_set.h"
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

void RadixTree::SetGuarantee(absl::string_view ns, NamespacePages guaranteed) {
  if (guaranteed.device <= 0 && guaranteed.host <= 0) {
    guarantees_.erase(ns);
    return;
  }
  guarantees_[ns] = guaranteed;
}

bool RadixTree::InScope(const Node* node, EvictionTier tier,
                        const EvictionScope& scope, int64_t taken,
                        absl::flat_hash_set<const Node*>* closed) const {
  if (!scope.only_ns.has_value() && guarantees_.empty()) return true;
  const Node* root = RootOf(node);
  if (closed != nullptr && closed->contains(root)) return false;
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
  if (held - pages >= floor) return true;
  if (closed != nullptr) closed->insert(root);
  return false;
}

bool RadixTree::SparedAsUncopied(const Node* node,
                                 const EvictionScope& scope) const {
  if (node->host != nullptr) return false;  // Demoted, not lost.
  const Node* root = RootOf(node);
  if (scope.requester.has_value() && *root->ns == *scope.requester) {
    return false;
  }
  auto it = guarantees_.find(*root->ns);
  return it != guarantees_.end() &&
         root->ns_device_pages <= kUncopiedSparedUpTo * it->second.device;
}

bool RadixTree::RequesterGuaranteed(const EvictionScope& scope) const {
  return scope.requester.has_value() && !scope.only_ns.has_value() &&
         guarantees_.contains(*scope.requester);
}

namespace {

EvictionScope WithoutRequester(const EvictionScope& scope) {
  EvictionScope first = scope;
  first.requester.reset();
  return first;
}

template <typename T>
void Append(std::vector<std::vector<T>>& to,
            std::vector<std::vector<T>>& from) {
  for (size_t i = 0; i < to.size() && i < from.size(); ++i) {
    to[i].insert(to[i].end(), from[i].begin(), from[i].end());
  }
}

}  // namespace

DeviceEvictResult RadixTree::EvictDeviceImpl(absl::Span<const int64_t> per_lane,
                                             int64_t tokens,
                                             const EvictionScope& scope) {
  if (scope.only_ns.has_value() || guarantees_.empty()) {
    return EvictDevicePass(per_lane, tokens, scope, /*demote_only=*/false);
  }
  // Passes, each only for what the ones before left short: (1) another
  // guaranteed namespace's nodes only demoted to their host copies, never
  // lost, and every namespace within its guarantee spared; (2) unbacked
  // nodes too; (3) the requester's own pages below its guarantee.
  struct Pass {
    EvictionScope scope;
    bool demote_only;
  };
  const bool own_pass = RequesterGuaranteed(scope);
  const EvictionScope others = own_pass ? WithoutRequester(scope) : scope;
  std::vector<Pass> passes = {{others, true}, {others, false}};
  if (own_pass) passes.push_back({scope, false});
  DeviceEvictResult result;
  std::vector<int64_t> rest(per_lane.begin(), per_lane.end());
  int64_t rest_tokens = tokens;
  for (const Pass& pass : passes) {
    DeviceEvictResult more =
        EvictDevicePass(rest, rest_tokens, pass.scope, pass.demote_only);
    if (result.freed_pages.empty()) {
      result = std::move(more);
    } else {
      Append(result.freed_pages, more.freed_pages);
      Append(result.freed_host_pages, more.freed_host_pages);
      result.evicted_tokens += more.evicted_tokens;
      result.nodes_to_host += more.nodes_to_host;
      result.nodes_removed += more.nodes_removed;
      result.victims_held_by_host_refs += more.victims_held_by_host_refs;
    }
    bool short_now = false;
    for (size_t l = 0; l < rest.size(); ++l) {
      rest[l] = per_lane[l] -
                (l < result.freed_pages.size()
                     ? static_cast<int64_t>(result.freed_pages[l].size())
                     : 0);
      short_now |= rest[l] > 0;
    }
    rest_tokens = tokens - result.evicted_tokens;
    if (per_lane.empty() ? rest_tokens <= 0 : !short_now) break;
  }
  return result;
}

HostEvictResult RadixTree::EvictHost(absl::Span<const int64_t> per_rank,
                                     bool redundant_first,
                                     int64_t redundant_after_ns,
                                     const EvictionScope& scope) {
  if (!RequesterGuaranteed(scope)) {
    return EvictHostPass(per_rank, redundant_first, redundant_after_ns, scope);
  }
  HostEvictResult result = EvictHostPass(
      per_rank, redundant_first, redundant_after_ns, WithoutRequester(scope));
  std::vector<int64_t> rest(per_rank.begin(), per_rank.end());
  bool short_now = false;
  for (size_t r = 0; r < rest.size() && r < result.freed_host_pages.size();
       ++r) {
    rest[r] -= static_cast<int64_t>(result.freed_host_pages[r].size());
    short_now |= rest[r] > 0;
  }
  if (!short_now) return result;
  HostEvictResult more =
      EvictHostPass(rest, redundant_first, redundant_after_ns, scope);
  Append(result.freed_host_pages, more.freed_host_pages);
  result.nodes_removed += more.nodes_removed;
  result.nodes_dropped += more.nodes_dropped;
  return result;
}

std::vector<NodeId> RadixTree::DeviceEvictionOrder(
    int64_t max_nodes, int64_t max_pages, const EvictionScope& scope) const {
  if (!RequesterGuaranteed(scope)) {
    return DeviceEvictionOrderPass(max_nodes, max_pages, scope);
  }
  std::vector<NodeId> order =
      DeviceEvictionOrderPass(max_nodes, max_pages, WithoutRequester(scope));
  int64_t pages = 0;
  for (NodeId id : order) {
    pages += static_cast<int64_t>(Find(id)->device_pages.size());
  }
  if (pages >= max_pages || static_cast<int64_t>(order.size()) >= max_nodes) {
    return order;
  }
  // Then the requester's own, in the order a second pass would take them.
  absl::flat_hash_set<NodeId> listed(order.begin(), order.end());
  for (NodeId id : DeviceEvictionOrderPass(max_nodes, max_pages, scope)) {
    if (pages >= max_pages || static_cast<int64_t>(order.size()) >= max_nodes) {
      break;
    }
    if (!listed.insert(id).second) continue;
    order.push_back(id);
    pages += static_cast<int64_t>(Find(id)->device_pages.size());
  }
  return order;
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
      return absl::InternalError(
          absl::StrCat("namespace '", name, "' is tallied at ", kept.device,
                       " device and ", kept.host, " host pages but holds ",
                       counted.device, " and ", counted.host));
    }
  }
  return absl::OkStatus();
}

}  // namespace hicache
