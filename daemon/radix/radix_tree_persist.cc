// RadixTree: what it reports to a durable index of its host tier, and how
// recovery rebuilds host-only nodes from one (docs/hot-restart.md).
#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/core/check.h"
#include "daemon/radix/radix_tree.h"

namespace hicache {

using radix_internal::Node;

void RadixTree::SetHostTierListener(HostTierListener* listener,
                                    uint64_t next_persist_id) {
  // A detached key reader may still read the keys it was handed: until
  // ReleaseKeyHolds, no listener may take its place (the report count it
  // is measured against must not restart).
  HICACHE_CHECK(listener == nullptr || key_reader_ == nullptr,
                "a listener set before the last key reader was released");
  host_listener_ = listener;
  if (listener == nullptr) return;
  reports_ = 0;
  if (listener->HoldsKeys()) key_reader_ = listener;
  next_persist_id_ = std::max<uint64_t>(next_persist_id, 1);
}

void RadixTree::ReleaseKeyHolds(HostTierListener& listener) {
  if (key_reader_ != &listener) return;
  if (host_listener_ == &listener) return;  // Still set: it still reads.
  tokens_.Reclaim(std::numeric_limits<uint64_t>::max());
  key_reader_ = nullptr;
}

void RadixTree::FreeKeyBlocks(const Node* node,
                              absl::Span<const TokenStore::BlockId> blocks) {
  if (key_reader_ == nullptr || node->key_report == 0 ||
      node->key_report <= key_reader_->KeysReadThrough()) {
    for (TokenStore::BlockId block : blocks) tokens_.Free(block);
    return;
  }
  // Reported and maybe not read yet: kept until the reader is past every
  // report made so far (reports_ only grows, so epochs are in order), or,
  // once the reader is detached, until ReleaseKeyHolds.
  const uint64_t epoch = host_listener_ == key_reader_
                             ? reports_
                             : std::numeric_limits<uint64_t>::max();
  for (TokenStore::BlockId block : blocks) tokens_.FreeAfter(block, epoch);
}

void RadixTree::ReportHostDropped(Node* node) {
  if (node->host == nullptr || node->persist_id == 0) return;
  if (host_listener_ != nullptr) {
    ++reports_;
    host_listener_->OnHostDropped(node->persist_id);
  }
  node->persist_id = 0;
}

namespace {

// The recorded parent of a node with a host copy (host_tier_listener.h).
uint64_t RecordedParent(const Node* node) {
  const Node* parent = node->parent;
  if (parent->is_root()) return kRootParent;
  if (parent->host != nullptr && parent->persist_id != 0) {
    return parent->persist_id;
  }
  return kDetachedParent;
}

}  // namespace

void RadixTree::ReportHostCommitted(Node* node) {
  if (host_listener_ == nullptr) return;
  node->persist_id = next_persist_id_++;
  HostCommit commit;
  commit.persist_id = node->persist_id;
  commit.parent_persist_id = RecordedParent(node);
  const Node* root = node;
  while (!root->is_root()) root = root->parent;
  commit.ns = *root->ns;
  commit.key_blocks = node->blocks;
  commit.tokens = &tokens_;
  commit.host = node->host.get();
  commit.node = node->id;
  ++reports_;
  const bool reads_later = key_reader_ == host_listener_;
  if (!reads_later) {
    HICACHE_CHECK(tokens_.Pages(node->blocks, node->len(), &commit.key_pages),
                  "a node's token blocks do not hold its key");
  }
  host_listener_->OnHostCommitted(commit);
  if (reads_later && commit.key_read_later) {
    // It reads the key from the blocks later: they are kept from reuse
    // until it has read past this report.
    node->key_report = reports_;
  }
  // Host-backed children recorded detached (their parent had no host copy)
  // hang from this node from now on.
  for (const auto& [token, child] : node->children) {
    if (child->host != nullptr && child->persist_id != 0) {
      ++reports_;
      host_listener_->OnHostReparented(child->persist_id, node->persist_id);
    }
  }
}

absl::StatusOr<NodeId> RadixTree::RestoreHostNode(
    absl::string_view ns, NodeId parent_id, absl::Span<const int32_t> key,
    CpHostMeta host, uint64_t persist_id) {
  if (persist_id == 0 || restored_persist_ids_.contains(persist_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("persist id ", persist_id, " is 0 or already restored"));
  }
  if (key.empty() || host.logical_len() != static_cast<int64_t>(key.size()) ||
      host.page_size() != options_.page_size ||
      host.cp_size() != options_.cp_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "persist id ", persist_id, ": a key of ", key.size(),
        " tokens with a host copy of ", host.logical_len(), " tokens (page ",
        host.page_size(), ", cp ", host.cp_size(), ")"));
  }
  Node* parent = nullptr;
  if (parent_id == kNoNode) {
    parent = Root(ns, /*create=*/true);
  } else {
    parent = Find(parent_id);
    if (parent == nullptr || parent->is_root() || parent->host == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("persist id ", persist_id, ": parent node ", parent_id,
                       " is unknown or has no host copy"));
    }
    const Node* root = parent;
    while (!root->is_root()) root = root->parent;
    if (*root->ns != ns) {
      return absl::InvalidArgumentError(
          absl::StrCat("persist id ", persist_id, ": parent node ", parent_id,
                       " is in another namespace"));
    }
    if (parent->len() % options_.page_size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("persist id ", persist_id, ": parent node ", parent_id,
                       " ends inside a page"));
    }
  }
  Node* node = NewNode(parent, key);
  node->host = std::make_unique<CpHostMeta>(std::move(host));
  node->persist_id = persist_id;
  TallyHost(node, node->host->num_pages());
  host_tokens_ += node->len();
  restored_persist_ids_.insert(persist_id);
  Announce(node);
  next_persist_id_ = std::max(next_persist_id_, persist_id + 1);
  return node->id;
}

void RadixTree::VisitHostTier(
    const std::function<void(const HostCommit&)>& visit) const {
  for (const auto& [ns, root] : roots_) {
    std::vector<const Node*> stack = {root.get()};
    while (!stack.empty()) {
      const Node* node = stack.back();
      stack.pop_back();
      if (!node->is_root() && node->host != nullptr && node->persist_id != 0) {
        HostCommit commit{.persist_id = node->persist_id,
                          .parent_persist_id = RecordedParent(node),
                          .ns = ns,
                          .key_blocks = node->blocks,
                          .tokens = &tokens_,
                          .host = node->host.get(),
                          .node = node->id};
        HICACHE_CHECK(
            tokens_.Pages(node->blocks, node->len(), &commit.key_pages),
            "a node's token blocks do not hold its key");
        visit(commit);
      }
      for (const auto& [token, child] : node->children) stack.push_back(child);
    }
  }
}

}  // namespace hicache
