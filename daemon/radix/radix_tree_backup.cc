// RadixTree: a node's backup lifecycle (begin, commit, abort), the host
// chains a load reads, and device pages attached to a host-only node.
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/radix/radix_tree.h"

namespace hicache {

using radix_internal::Node;

absl::StatusOr<std::vector<int64_t>> RadixTree::DevicePagesPerLane(
    NodeId id) const {
  absl::StatusOr<Node*> node = FindOrError(id);
  if (!node.ok()) return node.status();
  std::vector<int64_t> lanes(options_.cp_size, 0);
  for (LogicalPage page : (*node)->device_pages) {
    ++lanes[page % options_.cp_size];
  }
  return lanes;
}

absl::Status RadixTree::BeginBackup(NodeId id, CpHostMeta reserved) {
  absl::StatusOr<Node*> found = FindOrError(id);
  if (!found.ok()) return found.status();
  Node* node = *found;
  if (node->is_root() || !node->on_device()) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", id, " has no device copy to back up"));
  }
  if (node->host != nullptr || node->pending != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", id, " already has a host copy or a backup in flight"));
  }
  if (options_.prefix_closed_host && !node->parent->is_root() &&
      node->parent->host == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", id,
                     "'s parent has no host copy (the host tier is "
                     "prefix-closed)"));
  }
  if (reserved.logical_len() != node->len() ||
      reserved.page_size() != options_.page_size ||
      reserved.cp_size() != options_.cp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("backup metadata for ", reserved.logical_len(),
                     " tokens does not fit"
                     " node ",
                     id, " of ", node->len(), " tokens"));
  }
  for (size_t i = 0; i < node->device_pages.size(); ++i) {
    if (reserved.page_owners()[i] != node->device_pages[i] % options_.cp_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "backup page_owners[", i, "] = ", reserved.page_owners()[i],
          " but the node's page ", node->device_pages[i], " is in lane ",
          node->device_pages[i] % options_.cp_size));
    }
  }
  node->pending = std::make_unique<CpHostMeta>(std::move(reserved));
  TallyHost(node, node->pending->num_pages());
  ++pending_backups_;
  return absl::OkStatus();
}

bool RadixTree::HostCopyCanJoinBelow(NodeId parent) const {
  if (!options_.prefix_closed_host || parent == kNoNode) return true;
  const Node* node = Find(parent);
  if (node == nullptr || node->detached) return false;
  return node->is_root() || node->host != nullptr || node->pending != nullptr;
}

absl::Status RadixTree::CommitBackup(NodeId id) {
  absl::StatusOr<Node*> node = FindOrError(id);
  if (!node.ok()) return node.status();
  if ((*node)->pending == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", id, " has no backup in flight"));
  }
  (*node)->host = std::move((*node)->pending);
  --pending_backups_;
  host_tokens_ += (*node)->len();
  ReportHostCommitted(*node);
  Announce(*node);
  return absl::OkStatus();
}

absl::StatusOr<CpHostMeta> RadixTree::AbortBackup(NodeId id) {
  absl::StatusOr<Node*> node = FindOrError(id);
  if (!node.ok()) return node.status();
  if ((*node)->pending == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", id, " has no backup in flight"));
  }
  CpHostMeta reserved = std::move(*(*node)->pending);
  TallyHost(*node, -reserved.num_pages());
  (*node)->pending.reset();
  --pending_backups_;
  return reserved;
}

absl::StatusOr<std::vector<NodeId>> RadixTree::HostOnlyChain(NodeId id) const {
  absl::StatusOr<Node*> node = FindOrError(id);
  if (!node.ok()) return node.status();
  std::vector<NodeId> chain;
  for (Node* n = *node; !n->is_root() && !n->on_device(); n = n->parent) {
    chain.push_back(n->id);
  }
  std::reverse(chain.begin(), chain.end());
  return chain;
}

absl::Status RadixTree::AttachDevicePages(NodeId id,
                                          absl::Span<const LogicalPage> pages) {
  absl::StatusOr<Node*> found = FindOrError(id);
  if (!found.ok()) return found.status();
  Node* node = *found;
  if (!node->host_only()) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", id, " is not host-only"));
  }
  if (!node->parent->is_root() && !node->parent->on_device()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", id, "'s parent is not on device; load ancestors first"));
  }
  const std::vector<Rank>& owners = node->host->page_owners();
  if (pages.size() != owners.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node ", id, " needs ", owners.size(), " pages, got ", pages.size()));
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] < 0 || pages[i] % options_.cp_size != owners[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("pages[", i, "] = ", pages[i], " is not in lane ",
                       owners[i], ", the recorded owner of that page"));
    }
  }
  SetDevicePages(node, std::vector<LogicalPage>(pages.begin(), pages.end()));
  return absl::OkStatus();
}

}  // namespace hicache
