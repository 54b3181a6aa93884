#pragma once

// Rebuilding the host tier from its journal at start (docs/hot-restart.md
// §6): every recorded page is verified against its checksum before its node
// can be matched, and whatever cannot be trusted is dropped, with its
// subtree.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/alloc/host_page_allocator.h"
#include "daemon/persist/journal_reader.h"
#include "daemon/pool/kv_geometry.h"
#include "daemon/pool/page_key_store.h"
#include "daemon/radix/radix_tree.h"

namespace hicache {

struct HostTierRecovery {
  int64_t records = 0;          // Live records the journal held.
  int64_t nodes_recovered = 0;  // Restored, matchable.
  int64_t pages_recovered = 0;  // Their host pages, all ranks.
  // Dropped, each with its subtree: pages that fail their checksums; a
  // parent that was dropped (or an orphan the loader found); pages another
  // record already holds or a node the tree refuses.
  int64_t dropped_checksum = 0;
  int64_t dropped_orphan = 0;
  int64_t dropped_conflict = 0;
  uint64_t verified_bytes = 0;
  absl::Duration verify_time;
  absl::Duration restore_time;
  uint64_t next_persist_id = 1;  // Above every restored id.
  // The restored records, parents first: what the new journal starts from.
  std::vector<persist::PutRecord> survivors;
};

struct HostTierRecoveryTargets {
  RadixTree* tree = nullptr;  // Empty.
  // Indexed by rank, every page free.
  absl::Span<HostPageAllocator* const> allocators;
  KvGeometry geometry;
  HostLayout layout = HostLayout::kLayerFirst;
  int64_t host_pages_per_rank = 0;
  // Indexed by rank: each host pool's bytes.
  std::vector<absl::Span<const uint8_t>> pools;
  // The pages' keys (the journal records none): every rank of the journal,
  // its page size and pages per rank.
  const PageKeyStore* keys = nullptr;
  int verify_threads = 1;
};

// Verifies every page of `journal.puts` (on verify_threads threads): its KV
// bytes and the tokens its key slot holds against the recorded checksum
// (PageRecordChecksum). Then restores the records top-down: reserves their
// pages exactly and adds host-only nodes to the tree, keyed by their slots. Never fails for what the journal says (that
// only drops records); INVALID_ARGUMENT for targets that do not fit the
// journal's geometry (ranks, pools).
absl::StatusOr<HostTierRecovery> RecoverHostTier(
    const persist::LoadedJournal& journal,
    const HostTierRecoveryTargets& targets);

}  // namespace hicache
