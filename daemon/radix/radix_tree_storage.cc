// RadixTree: what the storage tier (L3) needs of the tree -- a node's whole
// token path, for the keys of its pages, and host-only nodes promoted from
// the storage tier (docs/storage-tier.md).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/radix/page_keys.h"
#include "daemon/radix/radix_tree.h"

namespace hicache {

using radix_internal::Node;

absl::StatusOr<std::vector<int32_t>> RadixTree::PathTokens(
    NodeId id, std::string* ns) const {
  absl::StatusOr<Node*> found = FindOrError(id);
  if (!found.ok()) return found.status();
  std::vector<const Node*> path;
  int64_t total = 0;
  for (const Node* n = *found; !n->is_root(); n = n->parent) {
    path.push_back(n);
    total += n->len();
  }
  if (ns != nullptr) *ns = *RootOf(*found)->ns;
  std::vector<int32_t> tokens;
  tokens.reserve(total);
  const int64_t page = options_.page_size;
  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    const Node* n = *it;
    for (int64_t from = 0, b = 0; from < n->len(); from += page, ++b) {
      const int32_t* data = tokens_.Data(n->blocks[b]);
      tokens.insert(tokens.end(), data, data + std::min(page, n->len() - from));
    }
  }
  return tokens;
}

absl::StatusOr<NodeId> RadixTree::AttachHostNode(absl::string_view ns,
                                                 NodeId parent_id,
                                                 absl::Span<const int32_t> key,
                                                 CpHostMeta host) {
  if (key.empty() || host.logical_len() != static_cast<int64_t>(key.size()) ||
      host.page_size() != options_.page_size ||
      host.cp_size() != options_.cp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("a key of ", key.size(), " tokens with a host copy of ",
                     host.logical_len(), " tokens (page ", host.page_size(),
                     ", cp ", host.cp_size(), ")"));
  }
  Node* parent = nullptr;
  if (parent_id == kNoNode) {
    parent = Root(ns, /*create=*/true);
  } else {
    absl::StatusOr<Node*> found = FindOrError(parent_id);
    if (!found.ok()) return found.status();
    parent = *found;
    if (*RootOf(parent)->ns != ns) {
      return absl::InvalidArgumentError(
          absl::StrCat("node ", parent_id, " is not in namespace '", ns, "'"));
    }
    if (parent->detached) {
      return absl::FailedPreconditionError(
          absl::StrCat("node ", parent_id, " is detached"));
    }
    if (parent->len() % options_.page_size != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("node ", parent_id, " ends inside a page"));
    }
    if (options_.prefix_closed_host && parent->host == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("node ", parent_id,
                       " has no host copy (the host tier is prefix-closed)"));
    }
  }
  const int64_t first_page =
      std::min<int64_t>(options_.page_size, static_cast<int64_t>(key.size()));
  for (auto [it, end] = parent->children.equal_range(key[0]); it != end; ++it) {
    const Node* child = it->second;
    // A sub-page tail (a request that ended inside the page) is no
    // conflict: the extension goes beside it, as Insert puts it.
    if (child->len() < options_.page_size && child->len() < first_page) {
      continue;
    }
    if (CommonPrefix(child, key) >= first_page) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", child->id, " already holds the key's first page"));
    }
  }
  Node* node = NewNode(parent, key);
  node->host = std::make_unique<CpHostMeta>(std::move(host));
  TallyHost(node, node->host->num_pages());
  host_tokens_ += node->len();
  if (sketch_ != nullptr) {
    absl::StatusOr<std::vector<int32_t>> path = PathTokens(node->id, nullptr);
    if (path.ok()) {
      const int64_t start = (static_cast<int64_t>(path->size()) - node->len()) /
                            options_.page_size;
      SetFirstKey(node, PageKeys(ns, *path, options_.page_size).At(start));
    }
  }
  ReportHostCommitted(node);
  Announce(node);
  return node->id;
}

}  // namespace hicache
