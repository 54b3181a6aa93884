#include "daemon/engine/host_tier_recovery.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/pool/page_checksum.h"
#include "daemon/pool/page_key_store.h"
#include "daemon/radix/cp_host_meta.h"

namespace hicache {

absl::StatusOr<HostTierRecovery> RecoverHostTier(
    const persist::LoadedJournal& journal,
    const HostTierRecoveryTargets& targets) {
  const size_t ranks = journal.geometry.cp_size;
  if (targets.tree == nullptr || targets.keys == nullptr ||
      targets.allocators.size() != ranks || targets.pools.size() != ranks ||
      targets.keys->num_ranks() != ranks ||
      targets.keys->page_size() != journal.geometry.page_size ||
      targets.keys->pages_per_rank() != journal.geometry.host_pages_per_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host-tier recovery needs the tree, the page keys of the journal's "
        "geometry, and an allocator and a pool for each of its ",
        ranks, " ranks"));
  }
  HostTierRecovery out;
  out.records = static_cast<int64_t>(journal.puts.size());
  out.dropped_orphan = journal.orphans;

  // 1. Verify every page, all records at once, rank by rank. A page's
  // recorded checksum mixes its KV checksum with its tokens' (the key read
  // back from its slot), so the KV checksum expected is unmixed with the
  // slot's tokens: a slot holding another key expects other bytes.
  const absl::Time verify_start = absl::Now();
  const uint32_t page_size = journal.geometry.page_size;
  std::vector<bool> bad(journal.puts.size(), false);
  std::vector<std::vector<int64_t>> pages(ranks);
  std::vector<std::vector<uint64_t>> expected(ranks);
  std::vector<std::vector<size_t>> owner(ranks);  // Record of each page.
  for (size_t i = 0; i < journal.puts.size(); ++i) {
    const persist::PutRecord& put = journal.puts[i];
    // The loader validated every record: ForEachPage sees no bad shape.
    (void)persist::ForEachPage(
        put, page_size, [&](const persist::PutPage& page) {
          const int64_t host_page = put.host_pages[page.rank][page.index];
          absl::StatusOr<absl::Span<const int32_t>> tokens =
              targets.keys->Read(page.rank, host_page, page.tokens);
          if (!tokens.ok()) {
            bad[i] = true;
            return;
          }
          pages[page.rank].push_back(host_page);
          expected[page.rank].push_back(
              KvChecksumFor(put.checksums[page.rank][page.index], *tokens));
          owner[page.rank].push_back(i);
        });
  }
  for (size_t r = 0; r < ranks; ++r) {
    if (pages[r].empty()) continue;
    absl::StatusOr<std::vector<size_t>> mismatches = VerifyHostPages(
        targets.geometry, targets.layout, targets.host_pages_per_rank,
        targets.pools[r], pages[r], expected[r],
        std::max(1, targets.verify_threads));
    if (!mismatches.ok()) return mismatches.status();
    for (size_t position : *mismatches) bad[owner[r][position]] = true;
    out.verified_bytes += pages[r].size() * targets.geometry.BytesPerPage();
  }
  out.verify_time = absl::Now() - verify_start;

  // 2. Restore top-down (the loader lists parents first).
  const absl::Time restore_start = absl::Now();
  absl::flat_hash_map<uint64_t, NodeId> restored;
  for (size_t i = 0; i < journal.puts.size(); ++i) {
    const persist::PutRecord& put = journal.puts[i];
    out.next_persist_id = std::max(out.next_persist_id, put.persist_id + 1);
    NodeId parent = kNoNode;
    if (put.parent_persist_id != 0) {
      auto it = restored.find(put.parent_persist_id);
      if (it == restored.end()) {
        ++out.dropped_orphan;
        continue;
      }
      parent = it->second;
    }
    if (bad[i]) {
      ++out.dropped_checksum;
      continue;
    }
    // Reserve every rank's pages, all or nothing.
    size_t reserved = 0;
    for (; reserved < ranks; ++reserved) {
      if (!targets.allocators[reserved]
               ->ReserveExactly(put.host_pages[reserved])
               .ok()) {
        break;
      }
    }
    auto give_back = [&](size_t upto) {
      for (size_t r = 0; r < upto; ++r) {
        // Reserved just above: freeing them cannot fail.
        (void)targets.allocators[r]->Free(put.host_pages[r]);
      }
    };
    if (reserved < ranks) {
      give_back(reserved);
      ++out.dropped_conflict;
      continue;
    }
    // The key, from the pages' slots (verified above with the KV bytes).
    std::vector<int32_t> key;
    key.reserve(put.logical_len);
    (void)persist::ForEachPage(
        put, page_size, [&](const persist::PutPage& page) {
          // Read in step 1 already: it cannot fail now.
          absl::StatusOr<absl::Span<const int32_t>> tokens =
              targets.keys->Read(page.rank,
                                 put.host_pages[page.rank][page.index],
                                 page.tokens);
          if (tokens.ok()) {
            key.insert(key.end(), tokens->begin(), tokens->end());
          }
        });
    std::vector<Rank> owners(put.page_owners.begin(), put.page_owners.end());
    absl::StatusOr<CpHostMeta> meta = CpHostMeta::Create(
        put.logical_len, journal.geometry.page_size, journal.geometry.cp_size,
        std::move(owners), put.host_pages);
    absl::StatusOr<NodeId> node =
        meta.ok() ? targets.tree->RestoreHostNode(put.name_space, parent,
                                                  key, *std::move(meta),
                                                  put.persist_id)
                  : absl::StatusOr<NodeId>(meta.status());
    if (!node.ok()) {
      give_back(ranks);
      ++out.dropped_conflict;
      continue;
    }
    restored[put.persist_id] = *node;
    ++out.nodes_recovered;
    for (size_t r = 0; r < ranks; ++r) {
      out.pages_recovered += static_cast<int64_t>(put.host_pages[r].size());
    }
    out.survivors.push_back(put);
  }
  out.restore_time = absl::Now() - restore_start;
  return out;
}

}  // namespace hicache
