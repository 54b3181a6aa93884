// KV events: what each tier can serve, reported to the tier listener
// (tier_listener.h, docs/kv-events.md).
//
// Every change to a node's tiers goes through Announce, which compares what
// the node holds now with what was announced (Node::device_announced,
// host_announced) and reports the difference: stores first, then removes,
// so a tier move is announced stored on the new tier before removed from the
// old one. CheckInvariants checks that the announcements match the tree.

#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/core/check.h"
#include "daemon/radix/block_hashes.h"
#include "daemon/radix/radix_tree.h"

namespace hicache {

using radix_internal::Node;

absl::Status RadixTree::SetTierListener(TierListener* listener,
                                        uint32_t block_size,
                                        uint64_t hash_seed) {
  if (listener != nullptr &&
      (block_size == 0 || options_.page_size % block_size != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the KV event block size (", block_size,
                     " tokens) must divide the page size (", options_.page_size,
                     ")"));
  }
  if (listener == nullptr || block_size != announce_block_size_ ||
      hash_seed != hash_seed_) {
    ForgetAnnounced();
    for (auto& [id, node] : nodes_) {
      node->chain_known = false;
      node->block_hashes.clear();
      node->block_hashes.shrink_to_fit();
    }
  }
  tier_listener_ = listener;
  announce_block_size_ = listener == nullptr ? 0 : block_size;
  hash_seed_ = hash_seed;
  return absl::OkStatus();
}

void RadixTree::AnnounceAll(std::optional<absl::string_view> ns) {
  AnnounceEvery(ns, /*gone=*/false);
}

void RadixTree::WithdrawAll(std::optional<absl::string_view> ns) {
  AnnounceEvery(ns, /*gone=*/true);
}

void RadixTree::AnnounceEvery(std::optional<absl::string_view> ns, bool gone) {
  if (tier_listener_ == nullptr) return;
  for (auto& [name, root] : roots_) {
    if (ns.has_value() && name != *ns) continue;
    // Top-down, so parents' chain hashes are known before their children's.
    std::vector<Node*> stack = {root.get()};
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      if (!node->is_root()) Announce(node, gone);
      for (auto& [token, child] : node->children) stack.push_back(child);
    }
  }
}

void RadixTree::ClearAnnounced() {
  ForgetAnnounced();
  if (tier_listener_ != nullptr) tier_listener_->OnAllCleared();
}

void RadixTree::ForgetAnnounced() {
  shared_blocks_.clear();
  for (auto& [id, node] : nodes_) {
    node->device_announced = false;
    node->host_announced = false;
  }
}

bool RadixTree::WantsAnnounced(const Node* node, Tier tier) const {
  if (tier_listener_ == nullptr || node->is_root() || node->detached ||
      node->len() < options_.page_size) {
    return false;  // A sub-page tail alone announces nothing.
  }
  return tier == Tier::kDevice ? node->on_device() : node->host != nullptr;
}

void RadixTree::Announce(Node* node, bool gone) {
  if (tier_listener_ == nullptr) return;
  const bool device = !gone && WantsAnnounced(node, Tier::kDevice);
  const bool host = !gone && WantsAnnounced(node, Tier::kHost);
  if (host && !node->host_announced) {
    AnnounceTier(node, Tier::kHost, TierEvent::Kind::kStored);
  }
  if (device && !node->device_announced) {
    AnnounceTier(node, Tier::kDevice, TierEvent::Kind::kStored);
  }
  if (!device && node->device_announced) {
    AnnounceTier(node, Tier::kDevice, TierEvent::Kind::kRemoved);
  }
  if (!host && node->host_announced) {
    AnnounceTier(node, Tier::kHost, TierEvent::Kind::kRemoved);
  }
}

void RadixTree::AnnouncedPages(const Node* node) {
  const int64_t page = options_.page_size;
  const int64_t pages = node->len() / page;
  page_scratch_.clear();
  for (int64_t i = 0; i < pages; ++i) {
    page_scratch_.push_back(
        absl::MakeConstSpan(tokens_.Data(node->blocks[i]), page));
  }
}

uint64_t RadixTree::ChainStart(Node* node) {
  return node->parent->is_root() ? BlockHashes::Seed(*node->parent->ns,
                                                     hash_seed_)
                                 : ChainEnd(node->parent);
}

uint64_t RadixTree::ChainEnd(Node* node) {
  if (node->is_root()) return BlockHashes::Seed(*node->ns, hash_seed_);
  const std::vector<uint64_t>& hashes = BlockHashesOf(node);
  return hashes.empty() ? ChainStart(node) : hashes.back();
}

const std::vector<uint64_t>& RadixTree::BlockHashesOf(Node* node) {
  if (node->chain_known) return node->block_hashes;
  // The nearest ancestor whose hashes are known, then down from it.
  std::vector<Node*> path = {node};
  while (!path.back()->parent->is_root() && !path.back()->parent->chain_known) {
    path.push_back(path.back()->parent);
  }
  uint64_t hash = ChainStart(path.back());
  const int64_t page = options_.page_size;
  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    Node* n = *it;
    const int64_t pages = n->len() / page;
    n->block_hashes.clear();
    n->block_hashes.reserve(static_cast<size_t>(pages * page /
                                                announce_block_size_));
    for (int64_t i = 0; i < pages; ++i) {
      hash = BlockHashes::Chain(
          hash, absl::MakeConstSpan(tokens_.Data(n->blocks[i]), page),
          announce_block_size_, &n->block_hashes);
    }
    n->chain_known = true;
  }
  return node->block_hashes;
}

void RadixTree::AnnounceTier(Node* node, Tier tier, TierEvent::Kind kind) {
  TierEvent event;
  event.kind = kind;
  event.tier = tier;
  const Node* root = node;
  while (!root->is_root()) root = root->parent;
  event.ns = *root->ns;
  event.has_parent = !node->parent->is_root();
  if (event.has_parent) event.parent_hash = ChainEnd(node->parent);
  const std::vector<uint64_t>& hashes = BlockHashesOf(node);
  HICACHE_CHECK(!hashes.empty(), "an announced node has no block");
  (tier == Tier::kDevice ? node->device_announced : node->host_announced) =
      kind == TierEvent::Kind::kStored;
  // Blocks smaller than a page: siblings differ somewhere in their first
  // page, so the first blocks of it may be a sibling's too. Those are
  // counted, and reported only when the first node stores them or the last
  // removes them; shared ones are always a prefix of the node's blocks
  // (a chained hash shared implies every one before it is).
  size_t first = 0;
  const size_t per_page = options_.page_size / announce_block_size_;
  if (per_page > 1) {
    for (size_t i = 0; i < per_page && i < hashes.size(); ++i) {
      auto [it, inserted] = shared_blocks_.try_emplace({hashes[i], tier}, 0);
      const int32_t count =
          kind == TierEvent::Kind::kStored ? ++it->second : --it->second;
      HICACHE_CHECK(count >= 0, "a shared block removed more than stored");
      if (count == 0) shared_blocks_.erase(it);
      const bool reported =
          kind == TierEvent::Kind::kStored ? count == 1 : count == 0;
      if (!reported) first = i + 1;
    }
  }
  if (first == hashes.size()) return;
  if (first > 0) {
    event.has_parent = true;
    event.parent_hash = hashes[first - 1];
  }
  event.block_hashes = absl::MakeConstSpan(hashes).subspan(first);
  if (kind == TierEvent::Kind::kStored) {
    AnnouncedPages(node);
    // Shared blocks are only ever in the first page.
    page_scratch_[0] = page_scratch_[0].subspan(first * announce_block_size_);
    event.tokens = page_scratch_;
  }
  tier_listener_->OnTierEvent(event);
}

void RadixTree::SplitAnnounced(Node* head, Node* tail) {
  // The head's blocks were announced with the node's.
  head->device_announced = tail->device_announced;
  head->host_announced = tail->host_announced;
  if (tail->len() < options_.page_size) {
    // A sub-page tail announces nothing: every announced block is the head's.
    tail->device_announced = tail->host_announced = false;
  }
  if (!tail->chain_known) return;
  // The cached hashes split with the pages (the split is at a page boundary).
  const size_t head_blocks =
      static_cast<size_t>(head->len() / announce_block_size_);
  head->block_hashes.assign(tail->block_hashes.begin(),
                            tail->block_hashes.begin() + head_blocks);
  head->chain_known = true;
  tail->block_hashes.erase(tail->block_hashes.begin(),
                           tail->block_hashes.begin() + head_blocks);
  if (tier_listener_ == nullptr || options_.page_size == announce_block_size_ ||
      (!tail->device_announced && !tail->host_announced)) {
    return;
  }
  // The tail's new first page was announced as the node's middle: count
  // its blocks as a first page's (shared_blocks_).
  const size_t per_page = options_.page_size / announce_block_size_;
  for (size_t i = 0; i < per_page && i < tail->block_hashes.size(); ++i) {
    for (Tier tier : {Tier::kDevice, Tier::kHost}) {
      if (tier == Tier::kDevice ? tail->device_announced
                                : tail->host_announced) {
        ++shared_blocks_[{tail->block_hashes[i], tier}];
      }
    }
  }
}

absl::Status RadixTree::CheckAnnounced(const Node* node) const {
  for (Tier tier : {Tier::kDevice, Tier::kHost}) {
    const bool announced = tier == Tier::kDevice ? node->device_announced
                                                 : node->host_announced;
    if (announced != WantsAnnounced(node, tier)) {
      return absl::InternalError(absl::StrCat(
          "node ", node->id, " is ", announced ? "" : "not ", "announced on ",
          tier == Tier::kDevice ? "device" : "host", " but ",
          announced ? "does not hold" : "holds", " it"));
    }
  }
  return absl::OkStatus();
}

}  // namespace hicache
