// RadixTree: eviction (device, host, write-back staging order, the
// write-ahead cold end) and host admission.
#include <algorithm>
#include <functional>
#include <limits>
#include <queue>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "daemon/radix/radix_tree.h"

namespace hicache {

using radix_internal::Node;

void RadixTree::RemoveLeaf(Node* node) {
  Announce(node, /*gone=*/true);
  ReportHostDropped(node);
  if (node->on_device()) {
    TallyDevice(node, -static_cast<int64_t>(node->device_pages.size()));
    device_tokens_ -= node->len();
    if (node->lock_ref > 0) protected_tokens_ -= node->len();
  }
  if (node->host != nullptr) {
    TallyHost(node, -node->host->num_pages());
    host_tokens_ -= node->len();
  }
  if (node->pending != nullptr) {
    TallyHost(node, -node->pending->num_pages());
    --pending_backups_;
  }
  EraseChildLink(node->parent, node);
  FreeKeyBlocks(node, node->blocks);
  nodes_.erase(node->id);
  delete node;
}

void RadixTree::RemoveSubtree(
    Node* node, std::vector<std::vector<int64_t>>* freed_host_pages) {
  // Post-order without recursion: children first.
  std::vector<Node*> order = {node};
  for (size_t i = 0; i < order.size(); ++i) {
    for (auto& [token, child] : order[i]->children) order.push_back(child);
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = *it;
    if (n->host != nullptr) {
      for (Rank r = 0; r < options_.cp_size; ++r) {
        const auto& pages = n->host->host_pages(r);
        (*freed_host_pages)[r].insert((*freed_host_pages)[r].end(),
                                      pages.begin(), pages.end());
      }
    }
    RemoveLeaf(n);
  }
}

bool RadixTree::DeviceEvictable(const Node* node) const {
  if (node->is_root() || !node->on_device() || node->lock_ref > 0 ||
      node->pending != nullptr) {
    return false;
  }
  for (const auto& [token, child] : node->children) {
    if (child->on_device()) return false;
  }
  return true;
}

bool RadixTree::HostEvictable(const Node* node, int64_t now) const {
  return !node->is_root() && node->host_only() && node->host_ref == 0 &&
         node->lock_ref == 0 && node->pin_expiry_ns <= now &&
         node->children.empty();
}

namespace {

struct Candidate {
  EvictionKey key;
  Node* node;
  bool operator>(const Candidate& other) const { return key > other.key; }
};
using CandidateHeap =
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>>;

}  // namespace

void RadixTree::SetFirstKey(Node* node, uint64_t key) {
  if (sketch_ == nullptr) return;
  node->first_key = key;
  node->frequency = static_cast<uint32_t>(sketch_->Estimate(key));
  node->frequency_epoch = sketch_->agings();
}

void RadixTree::RecordAccess(Node* node, uint64_t key) {
  if (sketch_ == nullptr) return;
  node->insert_end = false;
  sketch_->Increment(key);
  SetFirstKey(node, key);
}

void RadixTree::KeySplitTail(Node* tail, uint64_t head_last_key) {
  if (sketch_ == nullptr) return;
  const int64_t count = std::min<int64_t>(options_.page_size, tail->len());
  SetFirstKey(tail, PageKeys::Next(head_last_key,
                                   absl::MakeConstSpan(
                                       tokens_.Data(tail->blocks[0]), count)));
}

EvictionFacts RadixTree::FactsOf(const Node* node) const {
  EvictionFacts facts{node->last_access_ns, node->created_ns, node->hit_count,
                      node->priority};
  facts.last_access_tick = node->last_access_tick;
  facts.reuse_credit = reuse_credit_;
  if (sketch_ != nullptr) {
    // The estimate when last read, halved for every aging since (as the
    // sketch's counters were).
    const int64_t agings = sketch_->agings() - node->frequency_epoch;
    facts.frequency = agings >= 32 ? 0 : node->frequency >> agings;
  }
  return facts;
}

EvictionKey RadixTree::KeyOf(const Node* node, EvictionTier tier) const {
  return MakeEvictionKey(options_.policy, FactsOf(node), node->id, tier);
}

bool RadixTree::HostRedundant(const Node* node, int64_t now) const {
  if (node->is_root() || !node->on_device() || node->host == nullptr ||
      node->host_ref != 0 || node->pin_expiry_ns > now) {
    return false;
  }
  if (options_.prefix_closed_host) {
    // The children's copies need this one.
    for (const auto& [token, child] : node->children) {
      if (child->host != nullptr || child->pending != nullptr) return false;
    }
  }
  return true;
}

uint32_t RadixTree::Frequency(NodeId id) const {
  const Node* node = Find(id);
  return node == nullptr ? 0 : FactsOf(node).frequency;
}

int RadixTree::HostVictimClass(bool redundant_first,
                               const EvictionScope& scope) const {
  const int64_t now = NowNs();
  int lowest = std::numeric_limits<int>::max();
  std::vector<const Node*> stack;
  for (const auto& [name, root] : roots_) stack.push_back(root.get());
  while (!stack.empty()) {
    const Node* node = stack.back();
    stack.pop_back();
    // Only what eviction may take: not a namespace's guaranteed pages.
    if (redundant_first && HostRedundant(node, now) &&
        InScope(node, EvictionTier::kHost, scope)) {
      return -1;
    }
    if (HostEvictable(node, now) && InScope(node, EvictionTier::kHost, scope)) {
      lowest = std::min(lowest, FrequencyClass(FactsOf(node).frequency));
    }
    for (const auto& [token, child] : node->children) stack.push_back(child);
  }
  return lowest;
}

bool RadixTree::AdmitToHost(NodeId id, int host_victim_class) const {
  const Node* node = Find(id);
  if (node == nullptr || sketch_ == nullptr) return true;
  if (!node->children.empty()) return true;  // Host-only children need it.
  return FrequencyClass(FactsOf(node).frequency) >= host_victim_class ||
         host_victim_class == std::numeric_limits<int>::max();
}

std::vector<NodeId> RadixTree::DeviceEvictionOrderPass(
    int64_t max_nodes, int64_t max_pages, const EvictionScope& scope) const {
  // EvictDevice's first phase, simulated: leaves in policy order, and a
  // parent joins once its last device child has been taken.
  absl::flat_hash_map<const Node*, int64_t> device_children;
  std::priority_queue<std::pair<EvictionKey, const Node*>,
                      std::vector<std::pair<EvictionKey, const Node*>>,
                      std::greater<>>
      heap;
  std::vector<const Node*> stack;
  for (const auto& [name, root] : roots_) stack.push_back(root.get());
  while (!stack.empty()) {
    const Node* node = stack.back();
    stack.pop_back();
    if (DeviceEvictable(node)) {
      heap.push({KeyOf(node, EvictionTier::kDevice), node});
    }
    for (const auto& [token, child] : node->children) {
      if (!child->on_device()) continue;
      ++device_children[node];
      stack.push_back(child);
    }
  }
  std::vector<NodeId> order;
  int64_t pages = 0;
  // Device pages each namespace (by root) has lost in the simulation.
  absl::flat_hash_map<const Node*, int64_t> taken;
  absl::flat_hash_set<const Node*> closed;  // See InScope.
  const bool scoped = scope.only_ns.has_value() || !guarantees_.empty();
  while (!heap.empty() && static_cast<int64_t>(order.size()) < max_nodes &&
         pages < max_pages) {
    const Node* node = heap.top().second;
    heap.pop();
    if (scoped) {
      int64_t& lost = taken[RootOf(node)];
      if (!InScope(node, EvictionTier::kDevice, scope, lost, &closed)) {
        continue;
      }
      lost += static_cast<int64_t>(node->device_pages.size());
    }
    order.push_back(node->id);
    pages += static_cast<int64_t>(node->device_pages.size());
    const Node* parent = node->parent;
    if (--device_children[parent] == 0 && !parent->is_root() &&
        parent->lock_ref == 0 && parent->pending == nullptr) {
      heap.push({KeyOf(parent, EvictionTier::kDevice), parent});
    }
  }
  return order;
}

DeviceEvictResult RadixTree::EvictDevice(
    absl::Span<const int64_t> pages_needed_per_lane,
    const EvictionScope& scope) {
  return EvictDeviceImpl(pages_needed_per_lane, 0, scope);
}

DeviceEvictResult RadixTree::EvictDeviceTokens(int64_t tokens,
                                               const EvictionScope& scope) {
  return EvictDeviceImpl({}, tokens, scope);
}

// Owner-lane eviction (per_lane targets) runs in two phases:
//
// 1. Leaves in policy order; a leaf with no page in a lane that is still short
//    is set aside (deferred), and a parent that becomes a leaf joins the queue.
// 2. Still short: ancestor unlocking (seed 001, "small lane deficits despite
//    large aggregate evictable capacity"). The short lane's pages may sit only
//    in ancestors whose children hold other lanes. The first deferred leaf in
//    policy order that leads to such an ancestor names the nearest one; its
//    device subtree is evicted, children first in policy order, then the
//    ancestor itself (stopping early if the lanes are satisfied), and phase 1
//    resumes with the ancestor's parent. Repeat until every lane is satisfied
//    or no deferred leaf leads anywhere.
//
// The children's pages in other lanes are the price of reaching the
// ancestor: they are freed too (and reported). Nothing locked, and nothing at
// or above a backup in flight, is ever taken: such a subtree can never empty,
// so its ancestors are never targets. Short lanes only shrink during a call,
// so a deferred leaf that leads nowhere is dropped for good.
DeviceEvictResult RadixTree::EvictDevicePass(absl::Span<const int64_t> per_lane,
                                             int64_t tokens,
                                             const EvictionScope& scope,
                                             bool demote_only) {
  const uint32_t lanes = options_.cp_size;
  const bool by_lane = !per_lane.empty();
  DeviceEvictResult result;
  result.freed_pages.resize(lanes);
  result.freed_host_pages.resize(lanes);
  std::vector<int64_t> need(lanes, 0);
  for (size_t l = 0; l < per_lane.size() && l < lanes; ++l)
    need[l] = per_lane[l];
  auto short_lane = [&](Rank lane) {
    return static_cast<int64_t>(result.freed_pages[lane].size()) < need[lane];
  };
  auto short_lanes = [&] {
    int64_t n = 0;
    for (uint32_t l = 0; l < lanes; ++l) n += short_lane(l) ? 1 : 0;
    return n;
  };
  auto satisfied = [&] {
    if (!by_lane) return result.evicted_tokens >= tokens;
    return short_lanes() == 0;
  };
  auto helps = [&](const Node* node) {
    if (!by_lane) return true;
    for (LogicalPage page : node->device_pages) {
      if (short_lane(page % lanes)) return true;
    }
    return false;
  };
  auto key_of = [&](const Node* node) {
    return KeyOf(node, EvictionTier::kDevice);
  };
  // Out of this pass: spared as uncopied (demote_only), or out of scope.
  // Either stays out for the call: a namespace's pages only shrink, and a
  // node gains no host copy, during it. The uncopied test comes first, so
  // that a node the pass would never take does not close its namespace;
  // `may_close` false asks without closing (a leaf deferred in phase 1 is
  // not taken yet).
  absl::flat_hash_set<const Node*> closed;  // See InScope.
  auto passed_over = [&](const Node* node, bool may_close = true) {
    if (demote_only && SparedAsUncopied(node, scope)) return true;
    return !InScope(node, EvictionTier::kDevice, scope, 0,
                    may_close ? &closed : nullptr);
  };
  if (satisfied()) return result;

  CandidateHeap heap;
  // Nodes at or above a backup in flight: never evictable in this call (with
  // locked nodes, whose ancestors are locked too).
  absl::flat_hash_set<const Node*> above_pending;
  std::vector<Node*> stack;
  for (auto& [name, root] : roots_) stack.push_back(root.get());
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    if (DeviceEvictable(node)) heap.push({key_of(node), node});
    if (by_lane && node->pending != nullptr) {
      for (const Node* n = node;
           !n->is_root() && above_pending.insert(n).second; n = n->parent) {
      }
    }
    for (auto& [token, child] : node->children) {
      if (child->on_device()) stack.push_back(child);
    }
  }
  auto stuck = [&](const Node* node) {
    return node->lock_ref > 0 || above_pending.contains(node);
  };

  // Whether a host-only node under `victim` holds a host reference: an
  // unbacked victim takes its host-only descendants with it (their KV is
  // useless without its), and a referenced one must stay (a write-back
  // staging or a load reads its host copy; issue 25's "releasing the host
  // reference ... NOT_FOUND").
  auto subtree_host_held = [](const Node* victim) {
    std::vector<const Node*> walk = {victim};
    while (!walk.empty()) {
      const Node* n = walk.back();
      walk.pop_back();
      if (n->host_ref > 0) return true;
      for (const auto& [token, child] : n->children) walk.push_back(child);
    }
    return false;
  };
  // Evicts one device leaf; returns its parent, or nullptr when the victim
  // stays (then it and its ancestors are stuck for the rest of the call).
  auto evict = [&](Node* victim) -> Node* {
    if (victim->host == nullptr && subtree_host_held(victim)) {
      ++result.victims_held_by_host_refs;
      for (const Node* n = victim;
           !n->is_root() && above_pending.insert(n).second; n = n->parent) {
      }
      return nullptr;
    }
    Node* parent = victim->parent;
    result.evicted_tokens += victim->len();
    ClearDevicePages(victim, &result.freed_pages);
    if (victim->host != nullptr) {
      ++result.nodes_to_host;
    } else {
      // Host-only descendants need this node's KV to be loadable: they go
      // with it, and their host pages are returned.
      RemoveSubtree(victim, &result.freed_host_pages);
      ++result.nodes_removed;
    }
    return parent;
  };

  // Phase 2 helper: the nearest unstuck ancestor of `leaf` with a page in a
  // short lane, or nullptr. Walks that found nothing are remembered until
  // the set of short lanes changes.
  absl::flat_hash_set<const Node*> leads_nowhere;
  int64_t memo_short_lanes = -1;
  auto reachable_ancestor = [&](const Node* leaf) -> Node* {
    if (const int64_t n = short_lanes(); n != memo_short_lanes) {
      leads_nowhere.clear();
      memo_short_lanes = n;
    }
    std::vector<const Node*> walked;
    for (Node* n = leaf->parent;
         !n->is_root() && !stuck(n) && !leads_nowhere.contains(n);
         n = n->parent) {
      if (helps(n)) return n;
      walked.push_back(n);
    }
    leads_nowhere.insert(walked.begin(), walked.end());
    return nullptr;
  };

  // Deferred leaves by eviction key; the key's tiebreak is the node id, so
  // a leaf evicted meanwhile is recognised (gone, or no longer on device).
  std::priority_queue<EvictionKey, std::vector<EvictionKey>, std::greater<>>
      deferred;
  while (true) {
    // Phase 1.
    while (!heap.empty() && !satisfied()) {
      Node* victim = heap.top().node;
      const EvictionKey key = heap.top().key;
      heap.pop();
      // A node that does not help is deferred (and closes nothing).
      if (!helps(victim)) {
        if (by_lane && !passed_over(victim, /*may_close=*/false)) {
          deferred.push(key);
        }
        continue;
      }
      if (passed_over(victim)) continue;
      Node* parent = evict(victim);
      if (parent != nullptr && DeviceEvictable(parent)) {
        heap.push({key_of(parent), parent});
      }
    }
    if (!by_lane || satisfied()) break;
    // Phase 2: one ancestor.
    Node* target = nullptr;
    while (!deferred.empty() && target == nullptr) {
      const Node* leaf = Find(std::get<2>(deferred.top()));
      if (leaf != nullptr && DeviceEvictable(leaf) && !stuck(leaf)) {
        target = reachable_ancestor(leaf);
      }
      if (target == nullptr) deferred.pop();
    }
    if (target == nullptr) break;  // No progress possible.
    CandidateHeap subtree;
    stack.assign(1, target);
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      if (DeviceEvictable(node)) subtree.push({key_of(node), node});
      for (auto& [token, child] : node->children) {
        if (child->on_device()) stack.push_back(child);
      }
    }
    bool progress = false;
    while (!subtree.empty() && !satisfied()) {
      Node* victim = subtree.top().node;
      subtree.pop();
      const bool reached = victim == target;
      if (stuck(victim)) continue;  // Held below (see evict).
      // Passed over: it stays, so `target` is never reached.
      if (passed_over(victim)) continue;
      Node* parent = evict(victim);     // May delete `victim`.
      if (parent == nullptr) continue;  // Kept: its ancestors are stuck now.
      progress = true;
      if (reached) {
        if (DeviceEvictable(parent)) heap.push({key_of(parent), parent});
        break;
      }
      if (DeviceEvictable(parent)) subtree.push({key_of(parent), parent});
    }
    // Nothing in the target's subtree could be taken (passed over or held):
    // the leaf that led there leads nowhere for this call. Each round thus
    // evicts something or drops a deferred leaf, so the call ends.
    if (!progress && !deferred.empty()) deferred.pop();
  }
  return result;
}

HostEvictResult RadixTree::EvictHostPass(
    absl::Span<const int64_t> host_pages_needed_per_rank, bool redundant_first,
    int64_t redundant_after_ns, const EvictionScope& scope) {
  const uint32_t ranks = options_.cp_size;
  HostEvictResult result;
  result.freed_host_pages.resize(ranks);
  std::vector<int64_t> need(ranks, 0);
  for (size_t r = 0; r < host_pages_needed_per_rank.size() && r < ranks; ++r) {
    need[r] = host_pages_needed_per_rank[r];
  }
  auto short_rank = [&](Rank r) {
    return static_cast<int64_t>(result.freed_host_pages[r].size()) < need[r];
  };
  auto satisfied = [&] {
    for (Rank r = 0; r < ranks; ++r) {
      if (short_rank(r)) return false;
    }
    return true;
  };
  if (satisfied()) return result;
  const int64_t now = NowNs();
  CandidateHeap heap;
  CandidateHeap redundant;  // Device nodes' host copies, MRU first.
  CandidateHeap ends;       // Insert-end leaves (learned tails), LRU first.
  absl::flat_hash_set<const Node*> closed;  // See InScope.
  const int64_t tail_pages = sketch_ != nullptr ? tails_.TailPages() : 0;
  std::vector<Node*> stack;
  for (auto& [name, root] : roots_) stack.push_back(root.get());
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    if (HostEvictable(node, now)) {
      heap.push({KeyOf(node, EvictionTier::kHost), node});
      if (tail_pages > 0 && node->insert_end) {
        ends.push({{node->last_access_ns, 0, node->id}, node});
      }
    } else if (redundant_first && HostRedundant(node, now) &&
               node->last_access_ns > redundant_after_ns) {
      // Most recently used first: its device copy stays longest.
      redundant.push({{-node->last_access_ns, 0, node->id}, node});
    }
    for (auto& [token, child] : node->children) stack.push_back(child);
  }
  auto helps = [&](const Node* node) {
    for (Rank r = 0; r < ranks; ++r) {
      if (short_rank(r) && !node->host->host_pages(r).empty()) return true;
    }
    return false;
  };
  auto take_host_pages = [&](const Node* node) {
    for (Rank r = 0; r < ranks; ++r) {
      const auto& pages = node->host->host_pages(r);
      result.freed_host_pages[r].insert(result.freed_host_pages[r].end(),
                                        pages.begin(), pages.end());
    }
  };
  while (!redundant.empty() && !satisfied()) {
    Node* node = redundant.top().node;
    redundant.pop();
    if (!helps(node) || !InScope(node, EvictionTier::kHost, scope, 0, &closed))
      continue;
    take_host_pages(node);
    TallyHost(node, -node->host->num_pages());
    host_tokens_ -= node->len();
    ReportHostDropped(node);
    node->host.reset();
    Announce(node);
    ++result.nodes_dropped;
  }
  // Learned unshared ends of requests, least recently used first. The heap
  // keeps its entries: one whose node is gone is skipped below by its id.
  while (!ends.empty() && !satisfied()) {
    Node* end = ends.top().node;
    ends.pop();
    if (!helps(end) || !InScope(end, EvictionTier::kHost, scope, 0, &closed))
      continue;
    const int64_t pages =
        (end->len() + options_.page_size - 1) / options_.page_size;
    if (pages > tail_pages) {
      Split(end, (pages - tail_pages) * options_.page_size);
      if (!helps(end)) continue;  // `end` is the tail now.
    }
    Node* parent = end->parent;
    take_host_pages(end);
    RemoveLeaf(end);
    ++result.nodes_removed;
    if (HostEvictable(parent, now)) {
      heap.push({KeyOf(parent, EvictionTier::kHost), parent});
    }
  }
  while (!heap.empty() && !satisfied()) {
    Node* victim = heap.top().node;
    const NodeId id = std::get<2>(heap.top().key);
    heap.pop();
    if (Find(id) != victim || !HostEvictable(victim, now)) continue;
    if (!helps(victim) ||
        !InScope(victim, EvictionTier::kHost, scope, 0, &closed)) {
      continue;
    }
    Node* parent = victim->parent;
    take_host_pages(victim);
    RemoveLeaf(victim);
    ++result.nodes_removed;
    if (HostEvictable(parent, now)) {
      heap.push({KeyOf(parent, EvictionTier::kHost), parent});
    }
  }
  return result;
}

std::vector<ColdNode> RadixTree::DeviceColdEnd(int64_t max_pages) const {
  std::vector<ColdNode> cold;
  for (NodeId id : DeviceEvictionOrder(1 << 20, max_pages)) {
    const Node* node = Find(id);
    if (node == nullptr || node->detached) continue;
    ColdNode c{.node = id,
               .device_pages = static_cast<int64_t>(node->device_pages.size()),
               .last_access_ns = node->last_access_ns};
    if (node->host == nullptr && node->pending == nullptr) {
      c.copy_target = id;
      for (const Node* up = node->parent;
           !up->is_root() && up->on_device() && up->host == nullptr;
           up = up->parent) {
        if (up->pending != nullptr) {  // Its commit comes first.
          c.copy_target = kNoNode;
          break;
        }
        c.copy_target = up->id;
      }
    }
    cold.push_back(c);
  }
  return cold;
}

}  // namespace hicache
