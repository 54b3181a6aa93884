#pragma once

// Internal to //daemon/radix: the node of RadixTree. Not part of the API.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/btree_map.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/radix/cp_host_meta.h"
#include "daemon/radix/token_store.h"

namespace hicache::radix_internal {

struct Node {
  uint64_t id = 0;
  Node* parent = nullptr;           // nullptr only for roots.
  const std::string* ns = nullptr;  // Roots only: the namespace.
  // Roots only: the pages the namespace's nodes hold (NamespacePages):
  // device pages, and host pages of committed copies and backups in flight.
  int64_t ns_device_pages = 0;
  int64_t ns_host_pages = 0;
  // This node's token segment: `length` tokens in TokenStore blocks (the
  // last one partial for a valid tail).
  std::vector<TokenStore::BlockId> blocks;
  int64_t length = 0;
  std::vector<LogicalPage> device_pages;  // ceil(len/P) pages, or empty.
  std::unique_ptr<CpHostMeta> host;       // Committed host copy.
  std::unique_ptr<CpHostMeta> pending;    // Reserved, backup in flight.
  absl::btree_multimap<int32_t, Node*> children;  // By first token.
  int32_t lock_ref = 0;  // Device protection; counts locks on the subtree.
  int32_t host_ref = 0;  // Host copy protection.
  uint32_t hit_count = 0;
  int32_t priority = 0;
  int64_t last_access_ns = 0;
  // RadixTree's pages-inserted clock at that access (eviction's age in
  // cache turnover rather than wall time).
  int64_t last_access_tick = 0;
  int64_t created_ns = 0;
  int64_t pin_expiry_ns = 0;  // 0 = not pinned.
  int64_t pin_ttl_ns = 0;
  // Content key of the node's first page (PageKeys), for the frequency
  // sketch; 0 when the tree keeps no sketch.
  uint64_t first_key = 0;
  // The sketch's estimate for first_key when last read, and the sketch's
  // aging count then (eviction reads these instead of the sketch: no random
  // memory access per candidate).
  uint32_t frequency = 0;
  int64_t frequency_epoch = 0;
  // The leaf holding the end of a finished insert's key, not matched since:
  // its last TailLearner::TailPages() pages are the first host victims.
  bool insert_end = false;
  // The host copy's id in the durable host-tier index (HostTierListener);
  // 0 without a host copy or without a listener.
  uint64_t persist_id = 0;
  // The last report that handed this node's token blocks to a listener that
  // reads them later (HostTierListener::HoldsKeys); 0: none. While the
  // listener has not read past it, freed blocks go into quarantine.
  uint64_t key_report = 0;
  // Lanes of a dead CP member (radix_tree_lanes.cc): a node dropped while
  // locked or host-referenced is detached -- out of its parent's children
  // (never matched again) and out of every counter -- and holds its former
  // pages here until its last lock and host reference go. `detached_top`:
  // the top of a detached subtree (its parent does not list it).
  // KV events (radix_tree_announce.cc): the tiers the tier listener was told
  // this node's blocks are on, and the hashes of its whole blocks (valid
  // once chain_known; computed on first use, only with a tier listener).
  bool device_announced = false;
  bool host_announced = false;
  bool chain_known = false;
  std::vector<uint64_t> block_hashes;
  bool detached = false;
  bool detached_top = false;
  std::vector<LogicalPage> detached_pages;
  std::unique_ptr<CpHostMeta> detached_host;

  int64_t len() const { return length; }
  bool on_device() const { return !device_pages.empty(); }
  bool is_root() const { return parent == nullptr; }
  bool host_only() const { return !on_device() && host != nullptr; }
};

}  // namespace hicache::radix_internal
