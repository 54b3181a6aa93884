#pragma once

// What a RadixTree tells a durable index of its host tier (L2) about every
// change to it (docs/hot-restart.md). The tree calls these synchronously,
// under the engine's serialization, while it changes; a listener records and
// returns (no I/O, no call back into the tree).
//
// Identity: a node gets a persist id (never 0, never reused by one tree) when
// its host copy first becomes visible. The index keeps, per persist id: its
// parent's persist id, its namespace, its own key (the tokens from its
// parent's end to its end) and its host copy (CpHostMeta).
//
// Parents: a node's recorded parent is its tree parent when that parent has a
// host copy (or kRootParent under a namespace root). A node whose parent has
// no host copy is recorded kDetachedParent: after a crash it cannot be
// reached (the path to it holds no bytes), so recovery drops it unless a
// later event attaches it. The index applies these rules itself:
//  * Dropped(id): the records whose parent is id become detached.
//  * Reparented(child, parent): child's parent becomes parent.
//  * Split(id, at, head): the first `at` tokens (a page boundary) of id
//    become the new record `head` (id's old parent, the first pages of its
//    host copy); id keeps the rest, with `head` as its parent. Children of
//    id stay id's.

#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/radix/cp_host_meta.h"
#include "daemon/radix/token_store.h"

namespace hicache {

inline constexpr uint64_t kRootParent = 0;
inline constexpr uint64_t kDetachedParent = std::numeric_limits<uint64_t>::max();

struct HostCommit {
  uint64_t persist_id = 0;
  uint64_t parent_persist_id = kRootParent;  // Or kDetachedParent.
  std::string_view ns;
  // The node's own tokens, one span per logical page (page_size tokens; the
  // last may be shorter), pointing into the tree: no copy is made for the
  // listener. Valid during the call only. Empty for a listener that
  // HoldsKeys(): it reads key_blocks later instead.
  std::vector<absl::Span<const int32_t>> key_pages;
  // The token blocks of the key, one per page (the last page's block holds
  // logical_len's remainder), in `tokens`. For a listener that HoldsKeys(),
  // tokens->Data(block) may be read from any thread until the listener's
  // KeysReadThrough() passes this report: the tree keeps the blocks from
  // reuse (and their tokens unchanged) until then, even after the node is
  // gone.
  absl::Span<const TokenStore::BlockId> key_blocks;
  const TokenStore* tokens = nullptr;
  // Set by a listener that HoldsKeys() when it will read key_blocks after
  // the call (left false for a commit it refuses): only then does the tree
  // keep the blocks from reuse, so what it keeps is bounded by what the
  // listener has queued.
  bool key_read_later = false;
  const CpHostMeta* host = nullptr;
  uint64_t node = 0;  // The tree's NodeId, e.g. to protect it meanwhile.

  // The key's tokens, concatenated (a copy): from key_pages, or (a
  // listener that HoldsKeys) from key_blocks.
  std::vector<int32_t> KeyTokens() const {
    std::vector<absl::Span<const int32_t>> from_blocks;
    if (key_pages.empty() && tokens != nullptr && host != nullptr) {
      tokens->Pages(key_blocks, host->logical_len(), &from_blocks);
    }
    std::vector<int32_t> key;
    for (absl::Span<const int32_t> page :
         key_pages.empty() ? from_blocks : key_pages) {
      key.insert(key.end(), page.begin(), page.end());
    }
    return key;
  }
};

class HostTierListener {
 public:
  virtual ~HostTierListener() = default;
  // A host copy became visible (a committed backup). `commit` is valid
  // during the call only.
  virtual void OnHostCommitted(HostCommit& commit) = 0;
  // Whether the listener reads a commit's key blocks after OnHostCommitted
  // returns (HostCommit). Asked once, when the listener is set.
  virtual bool HoldsKeys() const { return false; }
  // A listener that HoldsKeys(): N such that it reads the key of no commit
  // among the first N calls the tree made to it (every method below counts,
  // in the tree's order, from 1 since it was set). Never decreases; may be
  // called from the tree's serialization while other threads of the
  // listener move it on. After detaching the listener and once it has
  // stopped reading, its owner calls RadixTree::ReleaseKeyHolds.
  virtual uint64_t KeysReadThrough() const { return 0; }
  // `child` (recorded detached) now hangs from `parent`, which just got its
  // host copy.
  virtual void OnHostReparented(uint64_t child, uint64_t parent) = 0;
  // The host copy of `persist_id` is gone: its node was removed, or only its
  // host copy was dropped (the node stays on device). Its pages are freed
  // after this returns.
  virtual void OnHostDropped(uint64_t persist_id) = 0;
  // The node `persist_id` split at token `at`; `head_persist_id` names the
  // new first part.
  virtual void OnHostSplit(uint64_t persist_id, int64_t at,
                           uint64_t head_persist_id) = 0;
};

}  // namespace hicache
