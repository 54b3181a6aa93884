#pragma once

// Builders shared by the journal tests and benchmark.

#include <cstdint>
#include <random>
#include <string>

#include "daemon/persist/journal_format.h"

namespace hicache::persist::testing {

inline JournalGeometry TestGeometry(uint32_t cp_size = 1) {
  JournalGeometry g;
  g.page_size = 16;
  g.cp_size = cp_size;
  g.kv_fingerprint = 0x1234abcd5678ef00ull;
  g.host_layout = "layer_first";
  g.host_pages_per_rank = 1 << 22;
  g.instance = "test-instance";
  return g;
}

// A valid Put of `pages` logical pages owned round-robin by the ranks, with
// page ids and checksums drawn from `rng`.
inline PutRecord MakePut(uint64_t id, uint64_t parent, const std::string& ns,
                         int pages, const JournalGeometry& g,
                         std::mt19937_64& rng) {
  PutRecord put;
  put.persist_id = id;
  put.parent_persist_id = parent;
  put.name_space = ns;
  put.logical_len = static_cast<int64_t>(pages) * g.page_size -
                    static_cast<int64_t>(rng() % g.page_size);
  put.host_pages.resize(g.cp_size);
  put.checksums.resize(g.cp_size);
  const uint32_t first = static_cast<uint32_t>(rng() % g.cp_size);
  for (int i = 0; i < pages; ++i) {
    const uint32_t owner = (first + static_cast<uint32_t>(i)) % g.cp_size;
    put.page_owners.push_back(owner);
    put.host_pages[owner].push_back(static_cast<int64_t>(
        rng() % static_cast<uint64_t>(g.host_pages_per_rank)));
    put.checksums[owner].push_back(rng());
  }
  return put;
}

}  // namespace hicache::persist::testing
