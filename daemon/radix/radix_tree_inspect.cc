// RadixTree: statistics, Dump/Inspect and the invariant checker.
#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "daemon/radix/radix_tree.h"

namespace hicache {

using radix_internal::Node;

TreeStats RadixTree::Stats() const {
  TreeStats stats;
  stats.nodes = static_cast<int64_t>(nodes_.size() - roots_.size() -
                                     detached_.size());
  stats.namespaces = static_cast<int64_t>(roots_.size());
  stats.device_tokens = device_tokens_;
  stats.protected_tokens = protected_tokens_;
  stats.evictable_tokens = device_tokens_ - protected_tokens_;
  stats.host_tokens = host_tokens_;
  stats.pending_backups = pending_backups_;
  return stats;
}

std::vector<NamespaceUsage> RadixTree::UsageByNamespace() const {
  std::vector<NamespaceUsage> out;
  out.reserve(roots_.size());
  std::vector<const Node*> stack;
  for (const auto& [ns, root] : roots_) {
    NamespaceUsage usage;
    usage.ns = ns;
    stack.assign(1, root.get());
    while (!stack.empty()) {
      const Node* node = stack.back();
      stack.pop_back();
      for (const auto& [token, child] : node->children) stack.push_back(child);
      if (node->is_root()) continue;
      ++usage.nodes;
      if (node->on_device()) usage.device_tokens += node->len();
      if (node->host != nullptr) usage.host_tokens += node->len();
    }
    out.push_back(std::move(usage));
  }
  return out;
}

NodeInfo RadixTree::Describe(const Node* node, int depth, int64_t start) const {
  NodeInfo info;
  info.id = node->id;
  info.parent = node->is_root() ? kNoNode : node->parent->id;
  const Node* root = node;
  while (!root->is_root()) root = root->parent;
  info.ns = *root->ns;
  info.depth = depth;
  info.start = start;
  info.len = node->len();
  const int64_t shown = std::min<int64_t>(4, node->len());
  for (int64_t i = 0; i < shown; ++i) {
    info.head_tokens.push_back(TokenAt(node, i));
    info.tail_tokens.push_back(TokenAt(node, node->len() - shown + i));
  }
  info.tier = node->on_device() ? (node->host != nullptr ? NodeTier::kBoth
                                                         : NodeTier::kDevice)
                                : NodeTier::kHost;
  info.pending_backup = node->pending != nullptr;
  info.lock_ref = node->lock_ref;
  info.host_ref = node->host_ref;
  info.hit_count = node->hit_count;
  info.priority = node->priority;
  const int64_t now = NowNs();
  if (node->pin_expiry_ns > now) {
    info.pin_remaining_ms = (node->pin_expiry_ns - now) / 1000000;
  }
  info.last_access_ns = node->last_access_ns;
  info.idle_ms = std::max<int64_t>(0, now - node->last_access_ns) / 1000000;
  if (node->host != nullptr) {
    info.page_owners = node->host->page_owners();
  } else {
    for (LogicalPage page : node->device_pages) {
      info.page_owners.push_back(page % options_.cp_size);
    }
  }
  info.num_children = static_cast<int64_t>(node->children.size());
  return info;
}

std::vector<NodeInfo> RadixTree::Dump(const DumpFilter& filter) const {
  std::vector<NodeInfo> out;
  struct Frame {
    const Node* node;
    int depth;
    int64_t start;
  };
  std::vector<const Node*> roots;
  for (const auto& [name, root] : roots_) {
    if (filter.all_namespaces || name == filter.ns) roots.push_back(root.get());
  }
  std::sort(roots.begin(), roots.end(),
            [](const Node* a, const Node* b) { return *a->ns < *b->ns; });
  const auto& prefix = filter.prefix;
  for (const Node* root : roots) {
    std::vector<Frame> stack = {{root, 0, 0}};
    while (!stack.empty()) {
      if (filter.limit >= 0 &&
          static_cast<int64_t>(out.size()) >= filter.limit) {
        return out;
      }
      const Frame frame = stack.back();
      stack.pop_back();
      const Node* node = frame.node;
      const int64_t end = frame.start + node->len();
      // Inside the prefix: the node's tokens must agree with it.
      bool agrees = true;
      for (int64_t i = frame.start;
           i < end && i < static_cast<int64_t>(prefix.size()); ++i) {
        if (TokenAt(node, i - frame.start) != prefix[i]) {
          agrees = false;
          break;
        }
      }
      if (!agrees) continue;
      if (!node->is_root() && end >= static_cast<int64_t>(prefix.size())) {
        out.push_back(Describe(node, frame.depth, frame.start));
        if (filter.include_tokens) {
          NodeInfo& info = out.back();
          info.tokens.reserve(static_cast<size_t>(node->len()));
          for (int64_t i = 0; i < node->len(); ++i) {
            info.tokens.push_back(TokenAt(node, i));
          }
        }
      }
      if (filter.max_depth >= 0 && frame.depth >= filter.max_depth) continue;
      // Children in token order, pushed reversed so they pop in order.
      std::vector<const Node*> children;
      for (const auto& [token, child] : node->children)
        children.push_back(child);
      for (auto it = children.rbegin(); it != children.rend(); ++it) {
        stack.push_back({*it, frame.depth + 1, end});
      }
    }
  }
  return out;
}

absl::StatusOr<NodeInfo> RadixTree::Inspect(NodeId id) const {
  absl::StatusOr<Node*> found = FindOrError(id);
  if (!found.ok()) return found.status();
  const Node* node = *found;
  if (node->detached) {
    return absl::NotFoundError(absl::StrCat("radix node ", id,
                                            " was dropped with its lanes"));
  }
  int depth = 0;
  int64_t start = 0;
  for (const Node* n = node; !n->is_root(); n = n->parent) {
    ++depth;
    if (n != node) start += n->len();
  }
  NodeInfo info = Describe(node, depth, start);
  info.device_pages = node->device_pages;
  if (node->host != nullptr) {
    for (Rank r = 0; r < options_.cp_size; ++r) {
      info.host_pages.push_back(node->host->host_pages(r));
    }
  }
  return info;
}

absl::Status RadixTree::CheckNode(const Node* node, int64_t start,
                                  TreeStats* totals) const {
  const int64_t page = options_.page_size;
  auto fail = [&](absl::string_view what) {
    return absl::InternalError(absl::StrCat("node ", node->id, " (start ",
                                            start, ", len ", node->len(),
                                            "): ", what));
  };
  auto found = nodes_.find(node->id);
  if (found == nodes_.end() || found->second != node) {
    return fail("missing from the id index");
  }
  if (absl::Status s = CheckAnnounced(node); !s.ok()) return s;
  if (!node->is_root()) {
    if (node->len() <= 0) return fail("empty key");
    if (static_cast<int64_t>(node->blocks.size()) !=
        (node->len() + page - 1) / page) {
      return fail("token block count does not match its length");
    }
    if (start % page != 0) return fail("does not start at a page boundary");
    if (node->len() % page != 0 && !node->children.empty()) {
      return fail("ends inside a page but has children");
    }
    const int64_t pages = (node->len() + page - 1) / page;
    if (!node->on_device() && node->host == nullptr) {
      return fail("is neither on device nor on host");
    }
    if (node->persist_id != 0 && node->host == nullptr) {
      return fail("has a persist id but no host copy");
    }
    if (node->on_device()) {
      if (static_cast<int64_t>(node->device_pages.size()) != pages) {
        return fail("device page count does not match its length");
      }
      if (!node->parent->is_root() && !node->parent->on_device()) {
        return fail("is on device but its parent is not");
      }
      totals->device_tokens += node->len();
      if (node->lock_ref > 0) totals->protected_tokens += node->len();
    } else if (node->pending != nullptr) {
      return fail("has a backup in flight but no device copy");
    }
    for (const CpHostMeta* meta : {node->host.get(), node->pending.get()}) {
      if (meta == nullptr) continue;
      if (meta->logical_len() != node->len() || meta->num_pages() != pages) {
        return fail("host metadata length differs from the node");
      }
    }
    // A backup in flight copies the device pages lane by lane, so its
    // owners must be their lanes. (A committed copy may differ from a device
    // copy re-attached later: the two are never copied into each other, and
    // load-back allocates with the committed owners.)
    if (node->pending != nullptr) {
      for (int64_t i = 0; i < pages; ++i) {
        if (node->pending->page_owners()[i] !=
            node->device_pages[i] % options_.cp_size) {
          return fail("backup page owners differ from device page lanes");
        }
      }
    }
    if (node->host != nullptr) totals->host_tokens += node->len();
    if (node->pending != nullptr) ++totals->pending_backups;
    if (options_.prefix_closed_host && !node->parent->is_root() &&
        node->parent->host == nullptr &&
        (node->host != nullptr || node->pending != nullptr)) {
      return fail("has a host copy (or a backup in flight) but its parent "
                  "has none: the host tier is not prefix-closed");
    }
    if (node->lock_ref < 0 || node->host_ref < 0) {
      return fail("negative reference count");
    }
    ++totals->nodes;
  }
  int64_t child_locks = 0;
  for (const auto& [token, child] : node->children) {
    if (child->parent != node) return fail("child's parent pointer is wrong");
    if (child->len() <= 0 || FirstToken(child) != token) {
      return fail("child indexed under the wrong first token");
    }
    child_locks += child->lock_ref;
  }
  if (!node->is_root() && node->lock_ref < child_locks) {
    return fail("lock_ref is below the sum of its children's");
  }
  return absl::OkStatus();
}

absl::Status RadixTree::CheckInvariants() const {
  TreeStats totals;
  absl::flat_hash_set<LogicalPage> device_pages;
  std::vector<absl::flat_hash_set<int64_t>> host_pages(options_.cp_size);
  int64_t visited = 0;
  for (const auto& [name, root] : roots_) {
    if (root->ns != &name) {
      return absl::InternalError(
          absl::StrCat("root of '", name, "' lost its namespace"));
    }
    std::vector<std::pair<const Node*, int64_t>> stack = {{root.get(), 0}};
    while (!stack.empty()) {
      auto [node, start] = stack.back();
      stack.pop_back();
      ++visited;
      if (absl::Status s = CheckNode(node, start, &totals); !s.ok()) return s;
      for (LogicalPage p : node->device_pages) {
        if (!device_pages.insert(p).second) {
          return absl::InternalError(
              absl::StrCat("device page ", p, " is used by two nodes"));
        }
      }
      for (const CpHostMeta* meta : {node->host.get(), node->pending.get()}) {
        if (meta == nullptr) continue;
        for (Rank r = 0; r < options_.cp_size; ++r) {
          for (int64_t hp : meta->host_pages(r)) {
            if (!host_pages[r].insert(hp).second) {
              return absl::InternalError(absl::StrCat(
                  "host page ", hp, " of rank ", r, " is used twice"));
            }
          }
        }
      }
      for (const auto& [token, child] : node->children) {
        stack.push_back({child, start + node->len()});
      }
    }
  }
  if (absl::Status s = CheckDetached(&device_pages, &host_pages); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckTallies(); !s.ok()) return s;
  visited += static_cast<int64_t>(detached_.size());
  if (visited != static_cast<int64_t>(nodes_.size())) {
    return absl::InternalError(absl::StrCat("id index holds ", nodes_.size(),
                                            " nodes, the tree ", visited));
  }
  if (totals.device_tokens != device_tokens_ ||
      totals.protected_tokens != protected_tokens_ ||
      totals.host_tokens != host_tokens_ ||
      totals.pending_backups != pending_backups_) {
    return absl::InternalError(
        absl::StrCat("counters drifted: device ", device_tokens_, " vs ",
                     totals.device_tokens, ", protected ", protected_tokens_,
                     " vs ", totals.protected_tokens, ", host ", host_tokens_,
                     " vs ", totals.host_tokens, ", pending ", pending_backups_,
                     " vs ", totals.pending_backups));
  }
  return absl::OkStatus();
}

}  // namespace hicache
