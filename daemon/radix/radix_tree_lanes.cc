// RadixTree: the lanes of a dead CP member (docs/engine.md, "Engine: lanes
// of a dead member"). When the daemon that owns some ranks dies, every byte
// on those lanes (device and host) is gone; nothing recorded there may be
// matched again, and what depends on it goes with it.
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/radix/radix_tree.h"

namespace hicache {

using radix_internal::Node;

namespace {

bool Marked(const std::vector<bool>& lanes, uint64_t lane) {
  return lane < lanes.size() && lanes[lane];
}

bool PagesTouch(const std::vector<LogicalPage>& pages,
                const std::vector<bool>& lanes, uint32_t cp_size) {
  for (LogicalPage page : pages) {
    if (Marked(lanes, static_cast<uint64_t>(page % cp_size))) return true;
  }
  return false;
}

bool OwnersTouch(const CpHostMeta* meta, const std::vector<bool>& lanes) {
  if (meta == nullptr) return false;
  for (Rank owner : meta->page_owners()) {
    if (Marked(lanes, owner)) return true;
  }
  return false;
}

void TakeHostPages(const CpHostMeta& meta, uint32_t cp_size,
                   std::vector<std::vector<int64_t>>* out) {
  for (Rank r = 0; r < cp_size; ++r) {
    const auto& pages = meta.host_pages(r);
    (*out)[r].insert((*out)[r].end(), pages.begin(), pages.end());
  }
}

LaneDropResult EmptyResult(uint32_t cp_size) {
  LaneDropResult result;
  result.freed_pages.resize(cp_size);
  result.freed_host_pages.resize(cp_size);
  return result;
}

}  // namespace

void RadixTree::SetUnmatchableLanes(std::vector<bool> lanes) {
  unmatchable_lanes_ = std::move(lanes);
  any_unmatchable_ = false;
  for (bool lane : unmatchable_lanes_) any_unmatchable_ |= lane;
}

bool RadixTree::MatchBlocked(const Node* node, bool device) const {
  if (!any_unmatchable_) return false;
  return device ? PagesTouch(node->device_pages, unmatchable_lanes_,
                             options_.cp_size)
                : OwnersTouch(node->host.get(), unmatchable_lanes_);
}

bool RadixTree::IsDetached(NodeId id) const {
  const Node* node = Find(id);
  return node != nullptr && node->detached;
}

void RadixTree::AbortPendingForLanes(Node* node, LaneDropResult* result) {
  if (node->pending == nullptr) return;
  TallyHost(node, -node->pending->num_pages());
  node->pending.reset();
  --pending_backups_;
  result->aborted_backups.push_back(node->id);
}

void RadixTree::DetachSubtree(Node* top, LaneDropResult* result) {
  EraseChildLink(top->parent, top);
  std::vector<Node*> order = {top};
  for (size_t i = 0; i < order.size(); ++i) {
    for (auto& [token, child] : order[i]->children) order.push_back(child);
  }
  // Children first: a node is deleted unless it (or a detached child, still
  // listed below it) is held.
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = *it;
    AbortPendingForLanes(n, result);
    const bool held =
        n->lock_ref > 0 || n->host_ref > 0 || !n->children.empty();
    if (!held) {
      ClearDevicePages(n, &result->freed_pages);
      if (n->host != nullptr) {
        TakeHostPages(*n->host, options_.cp_size, &result->freed_host_pages);
      }
      RemoveLeaf(n);  // Unlinks it from its parent (a no-op for `top`).
      ++result->nodes_removed;
      continue;
    }
    // Detached: out of every counter, its pages kept for ReapDetached.
    if (n->host != nullptr) {
      ReportHostDropped(n);
      TallyHost(n, -n->host->num_pages());
      host_tokens_ -= n->len();
      n->detached_host = std::move(n->host);
    }
    if (n->on_device()) {
      TallyDevice(n, -static_cast<int64_t>(n->device_pages.size()));
      device_tokens_ -= n->len();
      if (n->lock_ref > 0) protected_tokens_ -= n->len();
      n->detached_pages = std::move(n->device_pages);
      n->device_pages.clear();
    }
    n->detached = true;
    Announce(n, /*gone=*/true);
    n->detached_top = n == top;
    // Only a lock walks up from a detached node (Unlock), and a locked
    // node's parent outlives the lock. Unlocked, the top forgets its parent,
    // which may go first.
    if (n == top && n->lock_ref == 0) n->parent = nullptr;
    n->pin_expiry_ns = n->pin_ttl_ns = 0;
    detached_.insert(n);
    ++result->nodes_detached;
  }
}

LaneDropResult RadixTree::DropLanes(const std::vector<bool>& dead) {
  const uint32_t lanes = options_.cp_size;
  LaneDropResult result = EmptyResult(lanes);
  // Top-down; `on_device`: the parent is (still) on device (roots are).
  std::vector<std::pair<Node*, bool>> stack;
  for (auto& [name, root] : roots_) stack.push_back({root.get(), true});
  while (!stack.empty()) {
    auto [node, parent_on_device] = stack.back();
    stack.pop_back();
    std::vector<Node*> children;
    children.reserve(node->children.size());
    for (auto& [token, child] : node->children) children.push_back(child);
    for (Node* child : children) {
      const bool host_ok =
          child->host != nullptr && !OwnersTouch(child->host.get(), dead);
      const bool device_ok = child->on_device() && parent_on_device &&
                             !PagesTouch(child->device_pages, dead, lanes);
      if (child->on_device() && device_ok) {
        if (child->host != nullptr && !host_ok) {
          // Its host copy had pages there; the device copy stays.
          TakeHostPages(*child->host, lanes, &result.freed_host_pages);
          ReportHostDropped(child);
          TallyHost(child, -child->host->num_pages());
          host_tokens_ -= child->len();
          child->host.reset();
          Announce(child);
          ++result.host_copies_dropped;
        }
        stack.push_back({child, true});
        continue;
      }
      if (child->on_device() && host_ok && child->lock_ref == 0) {
        // Device copy gone, host copy intact: host-only now, as a backed
        // eviction victim (its device descendants follow below).
        AbortPendingForLanes(child, &result);
        ClearDevicePages(child, &result.freed_pages);
        ++result.device_copies_dropped;
        stack.push_back({child, false});
        continue;
      }
      if (!child->on_device() && child->host == nullptr) {
        stack.push_back({child, false});  // Holds nothing of any lane.
        continue;
      }
      if (!child->on_device() && host_ok) {
        stack.push_back({child, false});  // Host-only, loadable as before.
        continue;
      }
      DetachSubtree(child, &result);
    }
  }
  return result;
}

LaneDropResult RadixTree::ReapDetached() {
  LaneDropResult result = EmptyResult(options_.cp_size);
  // Candidates may repeat; one already deleted is no longer in detached_
  // (nothing is allocated meanwhile, so its address is not reused).
  while (!reapable_.empty()) {
    Node* n = reapable_.back();
    reapable_.pop_back();
    if (!detached_.contains(n) || n->lock_ref > 0 || n->host_ref > 0 ||
        !n->children.empty()) {
      continue;
    }
    for (LogicalPage page : n->detached_pages) {
      result.freed_pages[page % options_.cp_size].push_back(page);
    }
    if (n->detached_host != nullptr) {
      TakeHostPages(*n->detached_host, options_.cp_size,
                    &result.freed_host_pages);
    }
    // A detached top's parent may be gone (it does not list the top); any
    // other's is detached too, and may be deletable now.
    if (!n->detached_top) {
      EraseChildLink(n->parent, n);
      reapable_.push_back(n->parent);
    }
    FreeKeyBlocks(n, n->blocks);
    nodes_.erase(n->id);
    detached_.erase(n);
    delete n;
    ++result.nodes_removed;
  }
  return result;
}

LaneDropResult RadixTree::DetachedPages() const {
  LaneDropResult result = EmptyResult(options_.cp_size);
  for (const Node* n : detached_) {
    for (LogicalPage page : n->detached_pages) {
      result.freed_pages[page % options_.cp_size].push_back(page);
    }
    if (n->detached_host != nullptr) {
      TakeHostPages(*n->detached_host, options_.cp_size,
                    &result.freed_host_pages);
    }
  }
  return result;
}

absl::Status RadixTree::CheckDetached(
    absl::flat_hash_set<LogicalPage>* device_pages,
    std::vector<absl::flat_hash_set<int64_t>>* host_pages) const {
  for (const Node* n : detached_) {
    auto fail = [&](absl::string_view what) {
      return absl::InternalError(
          absl::StrCat("detached node ", n->id, ": ", what));
    };
    if (!n->detached || Find(n->id) != n) return fail("not indexed as such");
    if (n->device_announced || n->host_announced) {
      return fail("still announced");
    }
    if (n->on_device() || n->host != nullptr || n->pending != nullptr) {
      return fail("still holds tree pages");
    }
    for (const auto& [token, child] : n->children) {
      if (!child->detached || child->detached_top || child->parent != n) {
        return fail("has a child that is not detached below it");
      }
    }
    for (LogicalPage p : n->detached_pages) {
      if (!device_pages->insert(p).second) {
        return fail(absl::StrCat("device page ", p, " is used twice"));
      }
    }
    if (n->detached_host != nullptr) {
      for (Rank r = 0; r < options_.cp_size; ++r) {
        for (int64_t hp : n->detached_host->host_pages(r)) {
          if (!(*host_pages)[r].insert(hp).second) {
            return fail(absl::StrCat("host page ", hp, " of rank ", r,
                                     " is used twice"));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace hicache
