#pragma once

// What a RadixTree tells a router-facing index (KV events, docs/kv-events.md)
// about the blocks each tier can serve. The tree calls it synchronously,
// under the engine's serialization, while it changes; a listener copies what
// it needs and returns (no I/O, no call back into the tree).
//
// Blocks. The tree announces logical blocks of `block_size` tokens (a divisor
// of the page size), the scheduler's view: one announcement per block, not
// one per CP rank. A node announces the blocks of its full pages only: a
// sub-page tail (a leaf's last, partial page) is matchable only by a query
// that ends exactly there, and a sibling may share its tokens, so it is never
// announced. Every announced block therefore belongs to exactly one live
// node, and a block's state on a tier is its node's.
//
// Block hashes (BlockHashes in block_hashes.h): chained over the namespace and
// every token before the block, so a hash names a whole prefix.
//
// Tiers. kDevice: the node is matchable on device (its device pages are
// attached). kHost: its host copy has committed (the bytes have landed); a
// backup in flight is never announced. A node that moves between tiers is
// announced stored on the new tier before removed from the old one.
//
// Order: events for one namespace arrive in the tree's order.

#include <cstdint>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace hicache {

enum class Tier { kDevice = 0, kHost = 1 };

struct TierEvent {
  enum class Kind { kStored, kRemoved };
  Kind kind = Kind::kStored;
  Tier tier = Tier::kDevice;
  absl::string_view ns;
  // The hash of the block before the first one here; has_parent false for a
  // node directly under its namespace's root.
  bool has_parent = false;
  uint64_t parent_hash = 0;
  // One hash per block, in order (never empty).
  absl::Span<const uint64_t> block_hashes;
  // kStored: the blocks' tokens (block_hashes.size() * block_size in all),
  // in pieces to concatenate (views of the tree's pages: no copy is made for
  // the listener). Empty for kRemoved. Valid during the call only.
  absl::Span<const absl::Span<const int32_t>> tokens;
  int64_t TokenCount() const {
    int64_t n = 0;
    for (absl::Span<const int32_t> piece : tokens) n += piece.size();
    return n;
  }
};

class TierListener {
 public:
  virtual ~TierListener() = default;
  virtual void OnTierEvent(const TierEvent& event) = 0;
  // Every announcement so far is void (RadixTree::ClearAnnounced): the
  // subscribers should forget every block.
  virtual void OnAllCleared() = 0;
};

}  // namespace hicache
