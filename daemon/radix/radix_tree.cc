#include "daemon/core/check.h"
#include "daemon/radix/radix_tree.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hicache {

using radix_internal::Node;

namespace {}  // namespace

absl::StatusOr<std::unique_ptr<RadixTree>> RadixTree::Create(
    const RadixTreeOptions& options) {
  if (options.page_size == 0 ||
      (options.page_size & (options.page_size - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size must be a power of two, got ", options.page_size));
  }
  if (options.cp_size == 0) {
    return absl::InvalidArgumentError("cp_size must be at least 1");
  }
  return std::unique_ptr<RadixTree>(new RadixTree(options));
}

RadixTree::RadixTree(const RadixTreeOptions& options)
    : options_(options),
      page_shift_(static_cast<uint32_t>(__builtin_ctz(options.page_size))),
      tokens_(options.page_size, options.reserve_tokens) {
  if (options_.clock == nullptr) options_.clock = Clock::Real();
  if (UsesFrequencySketch(options_.policy)) {
    sketch_ = std::make_unique<FrequencySketch>(FrequencySketch::Options{
        .expected_keys = std::max<int64_t>(options_.sketch_pages, 1 << 16)});
    reuse_credit_ =
        kReuseCreditTurnovers * std::max<int64_t>(options_.sketch_pages, 1 << 16);
  }
}

RadixTree::~RadixTree() {
  // Delete bottom-up without recursion depth limits.
  std::vector<Node*> stack;
  for (auto& [name, root] : roots_) {
    for (auto& [token, child] : root->children) stack.push_back(child);
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (auto& [token, child] : node->children) stack.push_back(child);
    delete node;
  }
  // Detached nodes (radix_tree_lanes.cc) are not reachable from a root.
  for (Node* node : detached_) delete node;
}

int64_t RadixTree::NowNs() const {
  return absl::ToUnixNanos(options_.clock->Now());
}

Node* RadixTree::Root(absl::string_view ns, bool create) {
  auto it = roots_.find(ns);
  if (it != roots_.end()) return it->second.get();
  if (!create) return nullptr;
  auto [inserted, ok] =
      roots_.emplace(std::string(ns), std::make_unique<Node>());
  Node* root = inserted->second.get();
  root->id = next_id_++;
  root->ns = &inserted->first;
  root->created_ns = root->last_access_ns = NowNs();
  nodes_[root->id] = root;
  return root;
}

absl::StatusOr<std::string> RadixTree::NamespaceOf(NodeId id) const {
  absl::StatusOr<Node*> found = FindOrError(id);
  if (!found.ok()) return found.status();
  const Node* node = *found;
  if (node->detached) {
    return absl::NotFoundError(absl::StrCat("radix node ", id,
                                            " was dropped with its lanes"));
  }
  while (!node->is_root()) node = node->parent;
  return *node->ns;
}

bool RadixTree::DropNamespaceIfEmpty(absl::string_view ns) {
  auto it = roots_.find(ns);
  if (it == roots_.end()) return false;
  const Node* root = it->second.get();
  if (!root->children.empty() || root->lock_ref != 0 || root->host_ref != 0 ||
      root->pin_expiry_ns != 0 || root->on_device() || root->host != nullptr ||
      root->pending != nullptr) {
    return false;
  }
  // A locked detached node below it still walks up to it (Unlock).
  for (const Node* node : detached_) {
    if (node->detached_top && node->parent == root) return false;
  }
  nodes_.erase(root->id);
  roots_.erase(it);
  return true;
}

Node* RadixTree::Find(NodeId id) const {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : it->second;
}

absl::StatusOr<Node*> RadixTree::FindOrError(NodeId id) const {
  Node* node = Find(id);
  if (node == nullptr) {
    return absl::NotFoundError(absl::StrCat("no radix node with id ", id));
  }
  return node;
}

void RadixTree::Touch(Node* node, int64_t now) {
  node->last_access_ns = now;
  node->last_access_tick = pages_inserted_;
}

Node* RadixTree::NewNode(Node* parent, absl::Span<const int32_t> key) {
  Node* node = new Node();
  node->id = next_id_++;
  node->parent = parent;
  node->length = static_cast<int64_t>(key.size());
  const int64_t page = options_.page_size;
  if (key_reader_ != nullptr && tokens_.blocks_quarantined() > 0) {
    tokens_.Reclaim(key_reader_->KeysReadThrough());
  }
  tokens_.AllocateMany((node->length + page - 1) / page, &node->blocks);
  for (int64_t i = 0, from = 0; from < node->length; ++i, from += page) {
    std::memcpy(tokens_.Data(node->blocks[i]), key.data() + from,
                sizeof(int32_t) * std::min(page, node->length - from));
  }
  pages_inserted_ += static_cast<int64_t>(node->blocks.size());
  node->created_ns = NowNs();
  Touch(node, node->created_ns);
  parent->children.emplace(key[0], node);
  nodes_[node->id] = node;
  return node;
}

int64_t RadixTree::CommonPrefix(const Node* node,
                                absl::Span<const int32_t> rest) const {
  const int64_t n = std::min<int64_t>(node->len(), rest.size());
  const int64_t page = options_.page_size;
  int64_t i = 0;
  for (TokenStore::BlockId block : node->blocks) {
    if (i >= n) break;
    const int32_t* tokens = tokens_.Data(block);
    const int64_t count = std::min(page, n - i);
    if (std::memcmp(tokens, rest.data() + i, sizeof(int32_t) * count) == 0) {
      i += count;
      continue;
    }
    int64_t j = 0;
    while (tokens[j] == rest[i + j]) ++j;
    return i + j;
  }
  return i;
}

void RadixTree::TruncateKey(Node* node, int64_t new_len) {
  const int64_t keep = (new_len + options_.page_size - 1) >> page_shift_;
  if (static_cast<int64_t>(node->blocks.size()) > keep) {
    FreeKeyBlocks(node, absl::MakeConstSpan(node->blocks).subspan(keep));
    node->blocks.resize(keep);
  }
  node->length = new_len;
}

void RadixTree::EraseChildLink(Node* parent, Node* child) {
  auto range = parent->children.equal_range(FirstToken(child));
  for (auto it = range.first; it != range.second; ++it) {
    if (it->second == child) {
      parent->children.erase(it);
      return;
    }
  }
}

Node* RadixTree::BestChild(const Node* node, absl::Span<const int32_t> rest,
                           int64_t* common,
                           absl::Span<const Node* const> skip) const {
  *common = 0;
  if (rest.empty()) return nullptr;
  Node* best = nullptr;
  auto [begin, end] = node->children.equal_range(rest[0]);
  for (auto it = begin; it != end; ++it) {
    Node* child = it->second;
    if (std::find(skip.begin(), skip.end(), child) != skip.end()) continue;
    const int64_t c = CommonPrefix(child, rest);
    // Longest common prefix wins; on a tie, the child that ends there (an
    // exact valid tail) wins.
    if (c > *common || (c == *common && best != nullptr && c == child->len() &&
                        c != best->len())) {
      best = child;
      *common = c;
    }
  }
  return best;
}

void RadixTree::SetDevicePages(Node* node, std::vector<LogicalPage> pages) {
  node->device_pages = std::move(pages);
  TallyDevice(node, static_cast<int64_t>(node->device_pages.size()));
  device_tokens_ += node->len();
  if (node->lock_ref > 0) protected_tokens_ += node->len();
  Announce(node);
}

void RadixTree::ClearDevicePages(Node* node,
                                 std::vector<std::vector<LogicalPage>>* out) {
  if (!node->on_device()) return;
  for (LogicalPage page : node->device_pages) {
    (*out)[page % options_.cp_size].push_back(page);
  }
  TallyDevice(node, -static_cast<int64_t>(node->device_pages.size()));
  node->device_pages.clear();
  node->device_pages.shrink_to_fit();
  device_tokens_ -= node->len();
  if (node->lock_ref > 0) protected_tokens_ -= node->len();
  Announce(node);
}

Node* RadixTree::Split(Node* node, int64_t at) {
  // `node` keeps its id (and its place under any lock held on it) and
  // becomes the tail; the new head takes its place under the parent.
  Node* parent = node->parent;
  EraseChildLink(parent, node);
  const int64_t head_blocks = at >> page_shift_;
  Node* head = new Node();
  head->id = next_id_++;
  head->parent = parent;
  head->length = at;
  head->blocks.assign(node->blocks.begin(), node->blocks.begin() + head_blocks);
  head->key_report = node->key_report;  // Its blocks were reported with it.
  node->blocks.erase(node->blocks.begin(), node->blocks.begin() + head_blocks);
  node->blocks.shrink_to_fit();
  node->length -= at;
  parent->children.emplace(FirstToken(head), head);
  nodes_[head->id] = head;
  head->lock_ref = node->lock_ref;
  head->host_ref = node->host_ref;
  head->hit_count = node->hit_count;
  head->priority = node->priority;
  head->last_access_ns = node->last_access_ns;
  head->last_access_tick = node->last_access_tick;
  head->created_ns = node->created_ns;
  head->pin_expiry_ns = node->pin_expiry_ns;
  head->pin_ttl_ns = node->pin_ttl_ns;
  head->first_key = node->first_key;  // The tail's is set by the caller.
  head->frequency = node->frequency;
  head->insert_end = false;  // The tail keeps the end.
  head->frequency_epoch = node->frequency_epoch;
  if (node->on_device()) {
    const int64_t pages = at >> page_shift_;
    head->device_pages.assign(node->device_pages.begin(),
                              node->device_pages.begin() + pages);
    node->device_pages.erase(node->device_pages.begin(),
                             node->device_pages.begin() + pages);
    node->device_pages.shrink_to_fit();
  }
  if (node->host != nullptr) {
    // REQUIRES (callers): `at` is a page boundary inside the node.
    auto halves = node->host->Split(at);
    HICACHE_CHECK(halves.ok(), "a host copy split outside its pages");
    head->host = std::make_unique<CpHostMeta>(std::move(halves->first));
    node->host = std::make_unique<CpHostMeta>(std::move(halves->second));
    if (node->persist_id != 0) {
      head->persist_id = next_persist_id_++;
      if (host_listener_ != nullptr) {
        ++reports_;
        host_listener_->OnHostSplit(node->persist_id, at, head->persist_id);
      }
    }
  }
  node->parent = head;
  head->children.emplace(FirstToken(node), node);
  SplitAnnounced(head, node);
  return head;
}

absl::StatusOr<MatchResult> RadixTree::MatchPrefix(
    absl::string_view ns, absl::Span<const int32_t> tokens,
    const MatchOptions& options) {
  MatchResult result;
  Node* node = Root(ns, /*create=*/false);
  if (node == nullptr) {
    // A miss is an access too (the insert that follows starts here).
    if (sketch_ != nullptr && options.record_hit && !tokens.empty()) {
      sketch_->Increment(PageKeys(ns, tokens, options_.page_size).At(0));
    }
    return result;
  }
  result.last_device_node = node->id;
  const int64_t now = options.record_hit ? NowNs() : 0;
  const int64_t page = options_.page_size;
  // A recorded query is one access of the first page of every node it hits
  // and of the first page past its hit, which is where the insert that
  // follows a miss starts its node (so a node evicted and asked for again
  // keeps its history). Keys are read only at node starts: counting these
  // pages, not every page, keeps the sketch off the hot path's profile.
  std::optional<PageKeys> keys;
  if (sketch_ != nullptr && options.record_hit) {
    keys.emplace(ns, tokens, options_.page_size);
  }
  int64_t pos = 0;
  bool on_device = true;
  while (pos < static_cast<int64_t>(tokens.size())) {
    int64_t common = 0;
    Node* child = BestChild(node, tokens.subspan(pos), &common);
    if (child == nullptr) break;
    // How much of this node counts as a hit.
    int64_t hit;
    const bool query_ends_here =
        pos + common == static_cast<int64_t>(tokens.size());
    if (common == child->len() &&
        (child->len() % page == 0 || (query_ends_here && options.exact_tail))) {
      hit = common;  // Whole node, or its exact valid tail.
    } else {
      hit = (common / page) * page;  // Floor inside the node / tail page.
    }
    if (hit == 0) break;
    const bool device = on_device && child->on_device();
    if (!device && child->host == nullptr) break;  // Not cached anywhere.
    if (MatchBlocked(child, device)) break;  // A lane no match may return.
    if (device && hit < child->len()) {
      if (child->pending != nullptr) {
        result.tail_blocked = true;
      } else if (options.split_at_hit && child->host_ref == 0) {
        Node* tail = child;
        if (keys && tail->children.empty()) {
          tails_.Observe((tail->len() - hit + page - 1) / page);
        }
        child = Split(child, hit);  // `hit` is a page boundary inside it.
        // The query matches the head: its page before the split keys it.
        if (keys) KeySplitTail(tail, keys->At((pos + hit) / page - 1));
      }
    }
    if (device) {
      result.device_len += hit;
      const int64_t pages = (hit + page - 1) / page;
      result.device_pages.insert(result.device_pages.end(),
                                 child->device_pages.begin(),
                                 child->device_pages.begin() + pages);
      result.last_device_node = child->id;
    } else {
      on_device = false;
      result.host_hit_len += hit;
      result.last_host_node = child->id;
    }
    if (keys) RecordAccess(child, keys->At(pos / page));
    if (options.record_hit) {
      Touch(child, now);
      ++child->hit_count;
      if (child->pin_ttl_ns > 0) child->pin_expiry_ns = now + child->pin_ttl_ns;
      if (device && options_.write_through_threshold > 0 &&
          child->hit_count >= options_.write_through_threshold &&
          child->host == nullptr && child->pending == nullptr) {
        result.write_through_candidates.push_back(child->id);
      }
    }
    if (hit < child->len()) {
      pos += hit;
      break;
    }
    pos += hit;
    node = child;
  }
  if (keys && pos < static_cast<int64_t>(tokens.size())) {
    sketch_->Increment(keys->At(pos / page));
  }
  return result;
}

// One pass of Insert. With dry_run it changes nothing and only reports
// whether the insert must be deferred.
absl::StatusOr<InsertResult> RadixTree::InsertImpl(
    Node* root, absl::Span<const int32_t> key,
    absl::Span<const LogicalPage> pages, const InsertOptions& options,
    bool dry_run) {
  InsertResult result;
  const int64_t page = options_.page_size;
  const int64_t total = options.unfinished
                            ? (static_cast<int64_t>(key.size()) / page) * page
                            : static_cast<int64_t>(key.size());
  const int64_t now = NowNs();
  // Caller pages of tokens [from, to) (both page-aligned, `to` may be the
  // key end).
  auto caller_pages = [&](int64_t from, int64_t to) {
    return std::vector<LogicalPage>(pages.begin() + from / page,
                                    pages.begin() + (to + page - 1) / page);
  };
  // The caller's pages for [from, to) that duplicate `node`'s pages from
  // token `node_from` on. A page identical to the node's own (the caller
  // passed the matched prefix back) is not a duplicate: nothing to free.
  auto add_duplicates = [&](int64_t from, int64_t to, const Node* node,
                            int64_t node_from) {
    const int64_t first = from / page;
    const int64_t last = (to + page - 1) / page;
    for (int64_t i = first; i < last; ++i) {
      const size_t own = static_cast<size_t>(node_from / page + (i - first));
      if (own < node->device_pages.size() && node->device_pages[own] == pages[i]) {
        continue;
      }
      result.duplicate_pages.push_back(pages[i]);
    }
  };
  auto finish = [&](int64_t cached) {
    result.cached_len = cached;
    const int64_t first_uncached = (cached + page - 1) / page;
    result.uncached_pages.assign(pages.begin() + first_uncached, pages.end());
  };

  // Content keys of the key's pages, for nodes this insert creates or
  // splits (only with a sketch; computed on first use).
  std::optional<PageKeys> keys;
  auto key_at = [&](int64_t token) -> uint64_t {
    if (sketch_ == nullptr) return 0;
    if (!keys) keys.emplace(*root->ns, key, options_.page_size);
    return keys->At(token / page);
  };
  auto split = [&](Node* child, int64_t start, int64_t at) {
    if (sketch_ != nullptr && child->children.empty()) {
      tails_.Observe((child->len() - at + page - 1) / page);
    }
    Node* head = Split(child, at);
    // `child` is the tail now; the key matches the head up to `at`.
    if (sketch_ != nullptr) KeySplitTail(child, key_at(start + at - page));
    return head;
  };
  auto new_leaf = [&](Node* parent, int64_t start, int64_t to) {
    Node* leaf = NewNode(
        parent, std::vector<int32_t>(key.begin() + start, key.begin() + to));
    leaf->priority = options.priority;
    if (sketch_ != nullptr) {
      SetFirstKey(leaf, key_at(start));
      leaf->insert_end = !options.unfinished;
    }
    SetDevicePages(leaf, caller_pages(start, to));
    return leaf;
  };

  Node* node = root;
  result.node = root->id;
  int64_t pos = 0;
  bool present = true;              // Still inside the part already on device.
  std::vector<const Node*> pruned;  // Dry run: leaves the real run removes.
  while (pos < total) {
    absl::Span<const int32_t> rest = key.subspan(pos, total - pos);
    int64_t common = 0;
    Node* child = BestChild(node, rest, &common, pruned);

    // No page in common with any child: a new leaf holds the rest.
    if (child == nullptr || (common < page && common < child->len())) {
      if (!dry_run) result.node = new_leaf(node, pos, total)->id;
      finish(total);
      return result;
    }

    // The key ends inside the child: everything is there if the child is on
    // device; nothing changes.
    if (common == static_cast<int64_t>(rest.size()) && common < child->len() &&
        child->on_device()) {
      if (present) result.present_len = pos + common;
      if (!dry_run) {
        add_duplicates(pos, total, child, 0);
        Touch(child, now);
        result.node = child->id;
      }
      finish(total);
      return result;
    }

    // A partial tail page that the key runs past: prune it when safe.
    if (common == child->len() && child->len() % page != 0 &&
        pos + common < total) {
      const int64_t aligned = (child->len() / page) * page;
      const bool safe = child->lock_ref == 0 && child->host == nullptr &&
                        child->host_ref == 0 && child->pending == nullptr &&
                        child->children.empty();
      if (!safe) {
        if (aligned == 0) {
          // The tail starts at this page boundary: the key continues in a
          // sibling leaf beside it (never touching the tail).
          if (!dry_run) result.node = new_leaf(node, pos, total)->id;
          finish(total);
          return result;
        }
        if (child->pending != nullptr) {  // Cannot split it now.
          result.deferred = true;
          return result;
        }
        if (child->host_ref > 0) {
          // Being loaded back: the load attaches the whole node, so it is
          // never split; cache nothing from here on.
          finish(pos);
          return result;
        }
        if (dry_run) {  // Split, then a sibling: nothing else can defer.
          finish(total);
          return result;
        }
        // Split at the tail's page boundary: the head is covered below and
        // the next pass puts the rest beside the tail.
        child = split(child, pos, aligned);
        common = aligned;
      } else if (dry_run) {
        if (aligned == 0) {
          pruned.push_back(child);
          continue;  // As the real run: re-examine the children of `node`.
        }
      } else {
        // Drop the stale tail page, then continue with the aligned part.
        result.released_pages.push_back(child->device_pages.back());
        child->device_pages.pop_back();
        TallyDevice(child, -1);
        device_tokens_ -= child->len() - aligned;
        if (aligned == 0) {
          RemoveLeaf(child);
          continue;  // Re-examine the children of `node`.
        }
        TruncateKey(child, aligned);
      }
      common = aligned;
    }

    // Split when the key diverges inside the child (at a page boundary).
    if (common < child->len()) {
      const int64_t at = (common / page) * page;  // >= page here.
      if (child->pending != nullptr) {
        result.deferred = true;
        return result;
      }
      if (child->host_ref > 0) {  // Being loaded back: never split.
        finish(pos);
        return result;
      }
      if (!dry_run) child = split(child, pos, at);
      common = at;
    }

    // `child` (or its head) is fully covered by the key now.
    if (dry_run) {
      if (!child->on_device()) present = false;
      pos += common;
      node = child;
      continue;
    }
    if (child->on_device()) {
      if (present) result.present_len = pos + common;
      add_duplicates(pos, pos + common, child, 0);
    } else if (child->host_ref > 0) {
      // Its host copy is being read (a load-back in flight will attach its
      // own pages): cache nothing from here on.
      finish(pos);
      return result;
    } else {
      present = false;
      SetDevicePages(child, caller_pages(pos, pos + common));  // Re-attach.
    }
    Touch(child, now);
    result.node = child->id;
    pos += common;
    node = child;
  }
  finish(total);
  return result;
}

absl::StatusOr<InsertResult> RadixTree::Insert(
    absl::string_view ns, absl::Span<const int32_t> tokens,
    absl::Span<const LogicalPage> pages, const InsertOptions& options) {
  const int64_t page = options_.page_size;
  const int64_t needed =
      (static_cast<int64_t>(tokens.size()) + page - 1) / page;
  if (static_cast<int64_t>(pages.size()) != needed) {
    return absl::InvalidArgumentError(
        absl::StrCat("insert of ", tokens.size(), " tokens needs ", needed,
                     " pages at page size ", page, ", got ", pages.size()));
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("pages[", i, "] = ", pages[i], " is negative"));
    }
  }
  Node* root = Root(ns, /*create=*/true);
  // Only a backup in flight can defer an insert; without one, skip the
  // read-only planning pass.
  if (pending_backups_ > 0) {
    absl::StatusOr<InsertResult> plan =
        InsertImpl(root, tokens, pages, options, /*dry_run=*/true);
    if (!plan.ok() || plan->deferred) return plan;
  }
  return InsertImpl(root, tokens, pages, options, /*dry_run=*/false);
}

absl::Status RadixTree::Lock(NodeId id) {
  absl::StatusOr<Node*> node = FindOrError(id);
  if (!node.ok()) return node.status();
  if ((*node)->detached) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", id, " was dropped with its lanes; it cannot be locked"));
  }
  for (Node* n = *node; !n->is_root(); n = n->parent) {
    if (n->lock_ref++ == 0 && n->on_device()) protected_tokens_ += n->len();
  }
  return absl::OkStatus();
}

absl::Status RadixTree::Unlock(NodeId id) {
  absl::StatusOr<Node*> node = FindOrError(id);
  if (!node.ok()) return node.status();
  if (!(*node)->is_root() && (*node)->lock_ref == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", id, " is not locked"));
  }
  for (Node* n = *node; !n->is_root(); n = n->parent) {
    if (--n->lock_ref == 0) {
      if (n->on_device()) protected_tokens_ -= n->len();
      if (n->detached) reapable_.push_back(n);  // ReapDetached.
    }
  }
  return absl::OkStatus();
}

absl::Status RadixTree::AddHostRef(NodeId id) {
  absl::StatusOr<Node*> node = FindOrError(id);
  if (!node.ok()) return node.status();
  if ((*node)->detached) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", id, " was dropped with its lanes"));
  }
  ++(*node)->host_ref;
  return absl::OkStatus();
}

absl::Status RadixTree::ReleaseHostRef(NodeId id) {
  absl::StatusOr<Node*> node = FindOrError(id);
  if (!node.ok()) return node.status();
  if ((*node)->host_ref == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", id, " holds no host reference"));
  }
  if (--(*node)->host_ref == 0 && (*node)->detached) {
    reapable_.push_back(*node);  // ReapDetached.
  }
  return absl::OkStatus();
}

absl::Status RadixTree::Pin(NodeId id, absl::Duration ttl) {
  absl::StatusOr<Node*> node = FindOrError(id);
  if (!node.ok()) return node.status();
  if ((*node)->detached) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", id, " was dropped with its lanes"));
  }
  if (ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pin ttl must be positive, got ", absl::FormatDuration(ttl)));
  }
  (*node)->pin_ttl_ns = absl::ToInt64Nanoseconds(ttl);
  (*node)->pin_expiry_ns = NowNs() + (*node)->pin_ttl_ns;
  return absl::OkStatus();
}

absl::Status RadixTree::Unpin(NodeId id) {
  absl::StatusOr<Node*> node = FindOrError(id);
  if (!node.ok()) return node.status();
  (*node)->pin_ttl_ns = 0;
  (*node)->pin_expiry_ns = 0;
  return absl::OkStatus();
}

absl::Status RadixTree::SetPriority(NodeId id, int32_t priority) {
  absl::StatusOr<Node*> node = FindOrError(id);
  if (!node.ok()) return node.status();
  (*node)->priority = priority;
  return absl::OkStatus();
}

}  // namespace hicache
