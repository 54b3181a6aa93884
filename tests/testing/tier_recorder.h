#pragma once

// Test helper: a TierListener that applies the tree's KV-event reports to a
// set of (namespace, block hash, tier), as a router's index would, and
// records every report that contradicts it (a store of a block already
// stored on that tier, a remove of one that is not, hashes that do not
// follow from the tokens).

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "daemon/radix/block_hashes.h"
#include "daemon/radix/radix_tree.h"
#include "daemon/radix/tier_listener.h"

namespace hicache::testing {

class TierRecorder final : public TierListener {
 public:
  using Key = std::tuple<std::string, uint64_t, Tier>;

  TierRecorder(uint32_t block_size, uint64_t hash_seed)
      : block_size_(block_size), hash_seed_(hash_seed) {}

  void OnTierEvent(const TierEvent& event) override {
    ++events;
    log.push_back({event.kind, event.tier, event.block_hashes.front()});
    const std::string ns(event.ns);
    if (event.block_hashes.empty()) errors.push_back("an empty event");
    if (event.kind == TierEvent::Kind::kStored) {
      std::vector<int32_t> tokens;
      for (absl::Span<const int32_t> piece : event.tokens) {
        tokens.insert(tokens.end(), piece.begin(), piece.end());
      }
      if (tokens.size() != event.block_hashes.size() * block_size_) {
        errors.push_back("tokens do not cover the blocks");
      } else {
        std::vector<uint64_t> expected;
        BlockHashes::Chain(event.has_parent
                               ? event.parent_hash
                               : BlockHashes::Seed(event.ns, hash_seed_),
                           tokens, block_size_, &expected);
        if (!std::equal(expected.begin(), expected.end(),
                        event.block_hashes.begin(),
                        event.block_hashes.end())) {
          errors.push_back("hashes do not follow from the tokens");
        }
      }
      stores[static_cast<int>(event.tier)] += event.block_hashes.size();
      for (uint64_t hash : event.block_hashes) {
        if (!held.insert({ns, hash, event.tier}).second) {
          errors.push_back("stored twice: " + std::to_string(hash));
        }
        if (event.has_parent && !Holds(ns, event.parent_hash)) {
          // A parent must be announced on some tier before its child.
          errors.push_back("parent unknown: " + std::to_string(hash));
        }
      }
    } else {
      if (!event.tokens.empty()) errors.push_back("tokens on a remove");
      for (uint64_t hash : event.block_hashes) {
        if (held.erase({ns, hash, event.tier}) == 0) {
          errors.push_back("removed but not stored: " + std::to_string(hash));
        }
      }
    }
  }

  void OnAllCleared() override {
    ++clears;
    held.clear();
  }

  bool Holds(const std::string& ns, uint64_t hash) const {
    return held.count({ns, hash, Tier::kDevice}) > 0 ||
           held.count({ns, hash, Tier::kHost}) > 0;
  }
  int64_t Count(Tier tier) const {
    int64_t n = 0;
    for (const Key& key : held) n += std::get<2>(key) == tier;
    return n;
  }

  // Every report in order: kind, tier and its first block's hash.
  struct Logged {
    TierEvent::Kind kind;
    Tier tier;
    uint64_t first_hash;
  };
  std::vector<Logged> log;
  std::set<Key> held;
  std::vector<std::string> errors;
  int64_t events = 0;
  int64_t clears = 0;
  int64_t stores[2] = {0, 0};  // Blocks stored, ever, per Tier.

 private:
  const uint32_t block_size_;
  const uint64_t hash_seed_;
};

// What the tree must have announced: every whole page of every node (a
// Dump with include_tokens), hashed from scratch, on the tiers that hold it.
inline std::set<TierRecorder::Key> AnnouncedByTree(const RadixTree& tree,
                                                   uint32_t block_size,
                                                   uint64_t hash_seed) {
  DumpFilter filter;
  filter.include_tokens = true;
  const std::vector<NodeInfo> nodes = tree.Dump(filter);
  const uint32_t page = tree.options().page_size;
  absl::flat_hash_map<NodeId, const NodeInfo*> by_id;
  for (const NodeInfo& n : nodes) by_id[n.id] = &n;
  // The whole sequence up to each node's end.
  std::function<std::vector<int32_t>(const NodeInfo&)> path =
      [&](const NodeInfo& n) {
        auto parent = by_id.find(n.parent);
        std::vector<int32_t> tokens =
            parent == by_id.end() ? std::vector<int32_t>() : path(*parent->second);
        tokens.insert(tokens.end(), n.tokens.begin(), n.tokens.end());
        return tokens;
      };
  std::set<TierRecorder::Key> out;
  for (const NodeInfo& n : nodes) {
    if (n.len < page) continue;
    std::vector<int32_t> tokens = path(n);
    tokens.resize(tokens.size() - n.len + n.len / page * page);
    std::vector<uint64_t> hashes;
    BlockHashes::Chain(BlockHashes::Seed(n.ns, hash_seed), tokens, block_size,
                       &hashes);
    const size_t own = n.len / page * page / block_size;
    for (size_t i = hashes.size() - own; i < hashes.size(); ++i) {
      if (n.tier != NodeTier::kHost) out.insert({n.ns, hashes[i], Tier::kDevice});
      if (n.tier != NodeTier::kDevice) out.insert({n.ns, hashes[i], Tier::kHost});
    }
  }
  return out;
}

}  // namespace hicache::testing
