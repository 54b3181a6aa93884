#pragma once

// The value types of RadixTree's API (radix_tree.h): ids, options, results,
// dump and stats records, namespace tallies and eviction scopes. Include
// radix_tree.h, which includes this.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "daemon/core/clock.h"
#include "daemon/core/policies.h"
#include "daemon/layout/cp_layout.h"

namespace hicache {

// Stable id of a radix node; never reused. Roots have ids too.
using NodeId = uint64_t;
inline constexpr NodeId kNoNode = 0;

struct RadixTreeOptions {
  uint32_t page_size = 64;
  uint32_t cp_size = 1;
  EvictionPolicy policy = EvictionPolicy::kLru;
  // A device node whose hit count reaches this (and has no host copy or
  // backup in flight) is reported by MatchPrefix as a write-through
  // candidate. 0 disables the report.
  uint32_t write_through_threshold = 0;
  const Clock* clock = nullptr;  // Default: Clock::Real().
  // Token storage mapped and pre-faulted at creation (see TokenStore); the
  // daemon passes its pool capacity in tokens. 0 = grow on demand.
  int64_t reserve_tokens = 0;
  // Distinct pages the frequency sketch is sized for (the pools' logical
  // capacity: device plus host pages of every lane); used only by a policy
  // that needs it (UsesFrequencySketch), and then at least 65,536.
  int64_t sketch_pages = 0;
  // The host tier is prefix-closed: every node with a committed host copy
  // has host copies of all its ancestors, so whatever the host holds can be
  // loaded (and recovered after a crash) without device-only ancestors.
  // BeginBackup then requires the parent's copy (or the root), a device
  // node's redundant copy is not dropped while a child has a copy or a
  // backup in flight, and CheckInvariants checks the closure.
  bool prefix_closed_host = false;
};

struct MatchOptions {
  // Update access times, hit counts and pin expiry of the matched nodes.
  // false makes MatchPrefix a pure lookup (CLI, dry runs).
  bool record_hit = true;
  // A query that ends exactly at a leaf's sub-page tail hits it exactly
  // (true) or floors the hit to the page boundary (false: the caller then
  // recomputes that page, so whatever it writes starts on a page boundary).
  bool exact_tail = true;
  // When the device hit ends inside a node, split the node there (a page
  // boundary; not a node with a backup in flight), so that the hit's
  // deepest node ends exactly at the hit and a lock on it protects nothing
  // past the hit (in particular not a sub-page tail that the caller's
  // longer insert will replace).
  bool split_at_hit = false;
};

struct MatchResult {
  int64_t device_len = 0;                 // Tokens hit on device.
  std::vector<LogicalPage> device_pages;  // ceil(device_len / P) pages.
  NodeId last_device_node = kNoNode;      // Deepest node holding the hit.
  NodeId last_host_node = kNoNode;        // Deepest host-only node of the
                                          // host hit, or kNoNode.
  int64_t host_hit_len = 0;  // Tokens after device_len hit on host only.
  // Tokens after the host hit held by the storage tier (L3), in whole
  // pages. Set by the engine's storage tier; the tree leaves it 0.
  int64_t storage_hit_len = 0;
  std::vector<NodeId> write_through_candidates;
  // The device hit ends inside a node with a backup in flight: inserting
  // past the hit would split it, so such an insert is deferred until the
  // backup commits or rolls back.
  bool tail_blocked = false;
};

struct InsertOptions {
  // The request is still running: only the page-complete prefix is cached.
  bool unfinished = false;
  int32_t priority = 0;  // For nodes the insert creates.
};

// Where each of the caller's pages went. Every caller page is in exactly one
// of: adopted by the tree (not listed), duplicate_pages, uncached_pages.
struct InsertResult {
  bool deferred = false;    // Conflicts with a backup in flight; nothing
                            // changed. Retry after it commits or rolls back.
  int64_t present_len = 0;  // Key tokens already on device before the call.
  int64_t cached_len = 0;   // Key tokens on device now (page floor or key).
  NodeId node = kNoNode;    // Node holding the last cached token.
  std::vector<LogicalPage> duplicate_pages;  // Caller frees: tree has them.
  std::vector<LogicalPage> uncached_pages;   // Beyond cached_len: caller's.
  std::vector<LogicalPage> released_pages;   // Tree pages dropped (a stale
                                             // sub-page tail): caller frees.
};

struct DeviceEvictResult {
  std::vector<std::vector<LogicalPage>> freed_pages;  // Per lane.
  int64_t evicted_tokens = 0;
  int64_t nodes_to_host = 0;  // Backed victims, now host-only.
  int64_t nodes_removed = 0;  // Unbacked victims (and their host-only
                              // descendants), removed.
  // Unbacked victims kept on the device because a host-only descendant,
  // which would go with them, holds a host reference (AddHostRef).
  int64_t victims_held_by_host_refs = 0;
  std::vector<std::vector<int64_t>> freed_host_pages;  // Per rank, from
                                                       // removed descendants.
};

struct HostEvictResult {
  std::vector<std::vector<int64_t>> freed_host_pages;  // Per rank.
  int64_t nodes_removed = 0;
  int64_t nodes_dropped = 0;  // Redundant host copies dropped (still on
                              // device).
};

// What RadixTree::DropLanes / ReapDetached took out of the tree.
struct LaneDropResult {
  std::vector<std::vector<LogicalPage>> freed_pages;   // Per lane: free now.
  std::vector<std::vector<int64_t>> freed_host_pages;  // Per rank: free now.
  // Nodes whose backup in flight was aborted (the reservation belongs to
  // the caller's backup record, which frees it).
  std::vector<NodeId> aborted_backups;
  int64_t device_copies_dropped = 0;  // Lost the device copy, host-only now.
  int64_t host_copies_dropped = 0;    // Lost the host copy, still on device.
  int64_t nodes_removed = 0;          // Deleted.
  int64_t nodes_detached = 0;         // Unmatchable; deleted when released.
};

enum class NodeTier { kDevice, kHost, kBoth };

// A node of the device tier's cold end, as write-ahead plans its copies
// (RadixTree::DeviceColdEnd).
struct ColdNode {
  NodeId node = kNoNode;
  int64_t device_pages = 0;
  int64_t last_access_ns = 0;
  // The node whose copy comes first for this one's: the node itself, or its
  // topmost ancestor on device without a host copy (a prefix-closed host
  // tier needs the ancestors first); kNoNode when the node has a copy or
  // one in flight, or an uncopied ancestor's copy is in flight.
  NodeId copy_target = kNoNode;
};

// A node as Dump()/Inspect() report it.
struct NodeInfo {
  NodeId id = kNoNode;
  NodeId parent = kNoNode;
  std::string ns;
  int depth = 0;      // Nodes below the root (root = 0).
  int64_t start = 0;  // Tokens before this node in its sequence.
  int64_t len = 0;
  std::vector<int32_t> head_tokens;  // First tokens (up to 4).
  std::vector<int32_t> tail_tokens;  // Last tokens (up to 4).
  NodeTier tier = NodeTier::kDevice;
  bool pending_backup = false;
  int32_t lock_ref = 0;
  int32_t host_ref = 0;
  uint32_t hit_count = 0;
  int32_t priority = 0;
  int64_t pin_remaining_ms = 0;   // 0 = not pinned.
  int64_t idle_ms = 0;            // Since the node's last access.
  int64_t last_access_ns = 0;     // That access, on the tree's clock.
  std::vector<Rank> page_owners;  // Owner of every page.
  std::vector<int32_t> tokens;    // Dump with include_tokens: its own.
  // Of its whole pages, those the storage tier holds (set by the engine's
  // storage tier; the tree leaves it 0).
  int64_t storage_pages = 0;
  int64_t num_children = 0;
  // Inspect() only:
  std::vector<LogicalPage> device_pages;
  std::vector<std::vector<int64_t>> host_pages;  // Per rank.
};

struct DumpFilter {
  std::string ns;  // Empty with all_namespaces = every one.
  bool all_namespaces = true;
  std::vector<int32_t> prefix;  // Only nodes whose sequence extends it.
  int max_depth = -1;           // -1 = unlimited.
  int64_t limit = -1;           // Max nodes reported, -1 = unlimited.
  bool include_tokens = false;  // NodeInfo::tokens.
};

struct TreeStats {
  int64_t nodes = 0;  // Excluding roots.
  int64_t namespaces = 0;
  int64_t device_tokens = 0;
  int64_t protected_tokens = 0;  // Device tokens under a lock.
  int64_t evictable_tokens = 0;  // device - protected.
  int64_t host_tokens = 0;       // Committed host copies.
  int64_t pending_backups = 0;
};

// What one namespace holds (RadixTree::UsageByNamespace).
struct NamespaceUsage {
  std::string ns;
  int64_t nodes = 0;          // Excluding the root.
  int64_t device_tokens = 0;  // Tokens of nodes on device.
  int64_t host_tokens = 0;    // Tokens of nodes with a committed host copy.
};

// Pages one namespace holds in the tree, in logical pages (one page of one
// lane): RadixTree::PagesOf. Also a namespace's guaranteed pages per tier
// (RadixTree::SetGuarantee).
struct NamespacePages {
  int64_t device = 0;  // Device pages of its nodes.
  int64_t host = 0;    // Host pages of its committed copies and backups in
                       // flight.
  bool operator==(const NamespacePages&) const = default;
};

// Whose eviction a call is (docs/quotas.md). The default scope takes any
// node, except from a namespace at its guaranteed pages. Eviction spares
// every namespace within its guarantee first, the requester's too, so that
// a namespace over its share loses its pages first; only if that is not
// enough does the requester lose its own pages below its guarantee.
struct EvictionScope {
  // Only this namespace's nodes are taken (a namespace making room under its
  // own limit); guarantees do not apply.
  std::optional<absl::string_view> only_ns;
  // The namespace whose allocation, load or backup needs the room: its own
  // nodes may be taken below its guarantee. nullopt: nobody's (operator
  // eviction, free-room targets, batches of several namespaces).
  std::optional<absl::string_view> requester;
};

}  // namespace hicache
