#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/core/clock.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/radix/host_tier_listener.h"
#include "daemon/radix/cp_host_meta.h"
#include "daemon/radix/eviction_policy.h"
#include "daemon/radix/frequency_sketch.h"
#include "daemon/radix/page_keys.h"
#include "daemon/radix/tail_learner.h"
#include "daemon/radix/tier_listener.h"
#include "daemon/radix/radix_node.h"
#include "daemon/radix/radix_types.h"
#include "daemon/radix/token_store.h"

namespace hicache {

// The logical radix tree over token ids: page-granular prefix matching and
// insertion, device and host tiers under CP shared KV, locks, pins and
// eviction planning. It only decides; the engine moves bytes and frees pages.
//
// Page rules (docs/radix-tree.md): every node starts at a page boundary;
// only a leaf may end inside a page (its valid tail), and a match ends there
// only when the query ends exactly there (and exact_tail); otherwise matches
// floor to a page boundary. Nodes split only at page boundaries. Backups in
// flight are invisible to matches and are never split.
//
// A key that runs past a sub-page tail replaces the tail when nothing
// protects it (no lock, no host copy or load, no backup in flight); else
// the tail stays and the key continues in a sibling leaf from the tail's
// page boundary with its own pages, so an extension is cached whoever holds
// the old tail (siblings may share first tokens; the longest match wins and
// an exact tail wins a tie).
//
// Thread-compatible: the engine serializes every call.
class RadixTree {
 public:
  // INVALID_ARGUMENT for a page size that is not a power of two or cp_size 0.
  static absl::StatusOr<std::unique_ptr<RadixTree>> Create(
      const RadixTreeOptions& options);
  ~RadixTree();

  const RadixTreeOptions& options() const { return options_; }

  absl::StatusOr<MatchResult> MatchPrefix(absl::string_view ns,
                                          absl::Span<const int32_t> tokens,
                                          const MatchOptions& options = {});

  // Caches `tokens` whose KV the caller wrote to `pages` (ceil(n/P) logical
  // pages). INVALID_ARGUMENT for a page count that does not fit the key or a
  // negative page.
  absl::StatusOr<InsertResult> Insert(absl::string_view ns,
                                      absl::Span<const int32_t> tokens,
                                      absl::Span<const LogicalPage> pages,
                                      const InsertOptions& options = {});

  // Device protection along the path to the root. NOT_FOUND for an unknown
  // id; Unlock FAILED_PRECONDITION if the node is not locked.
  absl::Status Lock(NodeId node);
  absl::Status Unlock(NodeId node);
  // Host-copy protection of one node.
  absl::Status AddHostRef(NodeId node);
  absl::Status ReleaseHostRef(NodeId node);
  // Protects the host copy from eviction for `ttl`; each recorded hit
  // extends it by `ttl` again. Unpin clears it.
  absl::Status Pin(NodeId node, absl::Duration ttl);
  absl::Status Unpin(NodeId node);
  absl::Status SetPriority(NodeId node, int32_t priority);

  // Backups. Begin: the node must be on device with neither a host copy nor
  // a backup in flight, and meta must describe exactly its pages (length and
  // page owners = lanes of its device pages). Commit makes it visible;
  // Abort returns the reservation so its host pages can be freed.
  absl::Status BeginBackup(NodeId node, CpHostMeta reserved);
  absl::Status CommitBackup(NodeId node);
  absl::StatusOr<CpHostMeta> AbortBackup(NodeId node);
  // Whether a backup of a new child of `parent` (kNoNode: of a namespace
  // root) may begin once it is cached: always, unless the host tier is
  // prefix-closed and `parent` is neither a root nor has a host copy or a
  // backup in flight (BeginBackup needs it committed by then). False for an
  // unknown node. O(1), no copy.
  bool HostCopyCanJoinBelow(NodeId parent) const;

  // Load-back. HostOnlyChain: the host-only ancestors of `node` and `node`
  // itself, top-down (empty if it is on device). AttachDevicePages: gives a
  // host-only node whose parent is on device its reloaded pages, whose lanes
  // must equal the recorded page owners.
  absl::StatusOr<std::vector<NodeId>> HostOnlyChain(NodeId node) const;
  absl::Status AttachDevicePages(NodeId node,
                                 absl::Span<const LogicalPage> pages);

  // Evicts unlocked device leaves in policy order until each lane has freed
  // pages_needed_per_lane[lane] pages (or no progress is possible). Leaves
  // with no page in a short lane are set aside; when a lane is still short,
  // an ancestor holding pages in it is reached by evicting its subtree,
  // children first (their other-lane pages are freed too; see
  // docs/radix-tree.md, "Ancestor unlocking"). Locked nodes and nodes at or
  // above a backup in flight are never taken. Backed victims become
  // host-only; unbacked ones are removed.
  //
  // Namespace guarantees (SetGuarantee): a node is taken only if `scope`
  // allows it (EvictionScope), and never when that would leave its
  // namespace, other than scope.requester, below its guaranteed device
  // pages. The same holds for every eviction below, per tier.
  DeviceEvictResult EvictDevice(
      absl::Span<const int64_t> pages_needed_per_lane,
      const EvictionScope& scope = {});
  // The device nodes eviction would take now, in policy order, if it took
  // them all: leaves, and each parent once its last device child is taken
  // (read-only; write-back stages its copies in this order). Stops after
  // max_nodes nodes or once the listed nodes hold max_pages device pages.
  std::vector<NodeId> DeviceEvictionOrder(
      int64_t max_nodes,
      int64_t max_pages = std::numeric_limits<int64_t>::max(),
      const EvictionScope& scope = {}) const;
  // DeviceEvictionOrder up to max_pages device pages, each node with what
  // write-ahead needs (ColdNode); O(depth) per node, no copy of pages or
  // tokens (Inspect copies both).
  std::vector<ColdNode> DeviceColdEnd(int64_t max_pages) const;
  // A node's device pages per lane (cp_size entries); NOT_FOUND if absent.
  absl::StatusOr<std::vector<int64_t>> DevicePagesPerLane(NodeId id) const;
  // Evicts until `tokens` device tokens are freed, any lanes.
  DeviceEvictResult EvictDeviceTokens(int64_t tokens,
                                      const EvictionScope& scope = {});
  // Removes host-only, unprotected, unpinned leaves in policy order until
  // each rank has freed host_pages_needed_per_rank[rank] host pages. A parent
  // becomes eligible once its last child is gone.
  //
  // With redundant_first (exclusive tiering under write-back), host copies
  // of nodes that are also on device -- redundant while the device copy
  // lives -- are dropped first, most recently used first (its device copy
  // will stay longest; not loaded or otherwise host-referenced, not pinned);
  // the node stays on device and a later device eviction writes it back.
  // They count in nodes_dropped, not nodes_removed.
  //
  // Under tinylfu, the learned unshared ends of requests go next (before any
  // other host-only node, least recently used first): the last
  // TailLearner::TailPages() pages of each host-only leaf that ends a
  // finished insert and was not matched since, split off at a page boundary
  // (the rest of the leaf stays).
  // `redundant_after_ns`: with redundant_first, only copies of device nodes
  // accessed after it are dropped first (write_ahead keeps the copies of
  // the device tier's cold end, which eviction is about to demote).
  HostEvictResult EvictHost(absl::Span<const int64_t> host_pages_needed_per_rank,
                            bool redundant_first = false,
                            int64_t redundant_after_ns = INT64_MIN,
                            const EvictionScope& scope = {});

  // Write-back admission: whether the device victim `node` may take host
  // room from what EvictHost would evict next (redundant copies first when
  // redundant_first). True when the node's frequency class is at least that
  // of the host tier's first victim, when nothing on the host tier can be
  // evicted by that order, or when the node has host-only children (dropping
  // it would drop them too). Always true for a policy without a sketch.
  // Compute once per batch with HostVictimClass() and pass it in.
  bool AdmitToHost(NodeId node, int host_victim_class) const;
  // FrequencyClass of the host tier's first victim; -1 when a redundant copy
  // can be dropped (redundant_first), INT_MAX when nothing is evictable.
  // Copies a namespace's guarantee keeps (the default EvictionScope) are no
  // victims.
  int HostVictimClass(bool redundant_first,
                      const EvictionScope& scope = {}) const;
  // The sketch's estimate for a node (0 without a sketch or unknown node).
  uint32_t Frequency(NodeId node) const;

  // --- Lanes of a dead CP member (radix_tree_lanes.cc) ---------------------
  // Lanes no match may return a page of (entry l: lane l; missing entries:
  // matchable). MatchPrefix stops before the first node whose device pages
  // (a device hit) or recorded page owners (a host hit) use one of them.
  void SetUnmatchableLanes(std::vector<bool> lanes);
  // Forgets every byte that lived on the lanes marked in `dead` (entry l:
  // lane l). Top-down: a host copy with a page owner on a dead lane is
  // dropped; a device copy with a page on a dead lane, or below a node that
  // is no longer on device, is dropped (the node stays host-only if its host
  // copy survives); a node left with neither, and its whole subtree, is
  // removed. A backup in flight on a node that loses its device copy is
  // aborted. A node to remove that is locked or host-referenced (or has
  // such a descendant) is detached instead: unmatchable at once, out of
  // every counter, refusing Lock/AddHostRef/Pin/Inspect, and deleted by
  // ReapDetached once released. The host listener hears of every dropped
  // host copy.
  LaneDropResult DropLanes(const std::vector<bool>& dead);
  // Deletes the detached nodes with no lock, host reference or detached
  // child left, returning their pages. O(nodes released since the last
  // call): Unlock and ReleaseHostRef note the detached nodes they release.
  LaneDropResult ReapDetached();
  bool HasReapable() const { return !reapable_.empty(); }
  // Every page detached nodes still hold (nothing is deleted).
  LaneDropResult DetachedPages() const;
  bool IsDetached(NodeId node) const;
  int64_t DetachedNodes() const {
    return static_cast<int64_t>(detached_.size());
  }

  // The namespace of a live node (its root's name); NOT_FOUND otherwise.
  // O(depth), no copy of the node's pages or tokens.
  absl::StatusOr<std::string> NamespaceOf(NodeId node) const;

  // Removes the root of namespace `ns` if it has no children and nothing
  // locks or pins it; returns whether it did. Keeps an idle tenant's name from
  // holding memory after its last node is gone.
  bool DropNamespaceIfEmpty(absl::string_view ns);

  // --- Namespace shares (docs/quotas.md) -----------------------------------
  // The pages namespace `ns` holds ({} for an unknown one). O(1): kept up to
  // date at every change (CheckInvariants recounts them).
  NamespacePages PagesOf(absl::string_view ns) const;
  // Every namespace the tree has a root for. O(namespaces).
  std::vector<std::string> Namespaces() const;
  // Eviction for another namespace's need (or nobody's) leaves `ns` at
  // least `guaranteed` pages per tier (0: no guarantee in that tier);
  // {} removes the guarantee. Outlives the namespace's root.
  void SetGuarantee(absl::string_view ns, NamespacePages guaranteed);

  TreeStats Stats() const;
  // One entry per namespace the tree knows, in no particular order; walks
  // every node (O(nodes), no allocation per node).
  std::vector<NamespaceUsage> UsageByNamespace() const;
  // The learned unshared end of a request, in pages (0: none learned).
  int64_t LearnedTailPages() const { return tails_.TailPages(); }
  std::vector<NodeInfo> Dump(const DumpFilter& filter) const;
  absl::StatusOr<NodeInfo> Inspect(NodeId node) const;

  // Every structural and accounting invariant; INTERNAL naming the first
  // violation. O(tree). For tests and debug builds.
  absl::Status CheckInvariants() const;

  // --- KV events (radix_tree_announce.cc; tier_listener.h) ----------------
  // From now on every change to what a tier can serve is reported to
  // `listener` (not owned; nullptr stops reporting and forgets every
  // announcement), in blocks of `block_size` tokens (a divisor of the page
  // size; INVALID_ARGUMENT otherwise) hashed from `hash_seed`
  // (block_hashes.h). Nothing already cached is announced: AnnounceAll.
  absl::Status SetTierListener(TierListener* listener, uint32_t block_size,
                               uint64_t hash_seed);
  // Announces what every node of `ns` (of every namespace: nullopt) holds
  // and was not announced yet. O(nodes of the namespace).
  void AnnounceAll(std::optional<absl::string_view> ns = std::nullopt);
  // Reports every announced block of `ns` (every namespace: nullopt) as
  // removed, and forgets the announcements.
  void WithdrawAll(std::optional<absl::string_view> ns = std::nullopt);
  // Forgets every announcement and tells the listener (OnAllCleared); an
  // AnnounceAll then announces everything again (a resync).
  void ClearAnnounced();

  // Durable host tier (docs/hot-restart.md). From now on every host-tier
  // change is reported to `listener` (not owned; nullptr stops reporting),
  // and host copies committed from now on get persist ids from
  // `next_persist_id` up (above every id a restored journal holds).
  void SetHostTierListener(HostTierListener* listener,
                           uint64_t next_persist_id = 1);
  // A listener that HoldsKeys(), detached (SetHostTierListener) and done
  // reading keys: every token block kept from reuse for it is free again.
  // Until then, blocks of nodes reported to it stay in quarantine when
  // freed, and no listener may be set (CHECK).
  void ReleaseKeyHolds(HostTierListener& listener);
  // Token blocks freed while a listener may still read them, not reused yet.
  int64_t key_blocks_quarantined() const {
    return tokens_.blocks_quarantined();
  }
  // The storage tier (radix_tree_storage.cc, docs/storage-tier.md).
  // The tokens from the namespace's root to the end of `node`, and its
  // namespace. NOT_FOUND for an unknown node.
  absl::StatusOr<std::vector<int32_t>> PathTokens(NodeId node,
                                                  std::string* ns) const;
  // A host-only node holding `key` and its host copy `host` (whose pages the
  // caller filled and hands over), as a new child of `parent` (kNoNode: the
  // root of `ns`): the storage tier's pages, promoted. Reported to the host
  // tier listener and announced like a committed backup. FAILED_PRECONDITION
  // (nothing changes) when the parent ends inside a page, is detached, is
  // neither the root nor holds a host copy while the host tier is
  // prefix-closed, or already has a child sharing the key's first page;
  // INVALID_ARGUMENT for an empty key, a host copy of another length or
  // shape, or a parent of another namespace; NOT_FOUND for an unknown
  // parent.
  absl::StatusOr<NodeId> AttachHostNode(absl::string_view ns, NodeId parent,
                                        absl::Span<const int32_t> key,
                                        CpHostMeta host);
  // Recovery: a host-only node with key `key` under `parent` (kNoNode: the
  // root of `ns`, created if needed) holding the host copy `host`, recorded
  // under `persist_id` (> 0; its pages the caller has reserved). Reports
  // nothing to the listener. INVALID_ARGUMENT for an empty key, a host copy
  // whose length is not the key's, an unknown parent, a parent without a
  // host copy, a repeated persist id, or a node that would not start at a
  // page boundary or follow a sub-page tail.
  absl::StatusOr<NodeId> RestoreHostNode(absl::string_view ns, NodeId parent,
                                         absl::Span<const int32_t> key,
                                         CpHostMeta host, uint64_t persist_id);
  // Every host copy with a persist id, parents before children, as the
  // listener was told (the parent rule of host_tier_listener.h): what a
  // compacted journal holds. O(tree).
  void VisitHostTier(
      const std::function<void(const HostCommit&)>& visit) const;

 private:
  using Node = radix_internal::Node;

  explicit RadixTree(const RadixTreeOptions& options);

  int64_t NowNs() const;
  Node* Root(absl::string_view ns, bool create);
  Node* Find(NodeId id) const;
  absl::StatusOr<Node*> FindOrError(NodeId id) const;
  // Records an access to `node` at `now`: its last access on the tree's
  // clock and on the pages-inserted clock (Node::last_access_tick).
  void Touch(Node* node, int64_t now);
  // A new child of `parent` holding `key` (copied into token blocks).
  Node* NewNode(Node* parent, absl::Span<const int32_t> key);
  int32_t FirstToken(const Node* node) const {
    return tokens_.Data(node->blocks[0])[0];
  }
  int32_t TokenAt(const Node* node, int64_t i) const {
    return tokens_.Data(
        node->blocks[i >> page_shift_])[i & (options_.page_size - 1)];
  }
  // Length of the common prefix of the node's key and `rest`.
  int64_t CommonPrefix(const Node* node, absl::Span<const int32_t> rest) const;
  // Drops the node's tokens after `new_len` (a page boundary, or its length).
  void TruncateKey(Node* node, int64_t new_len);
  void EraseChildLink(Node* parent, Node* child);
  // The child of `node` sharing the longest prefix with `rest`; sets *common.
  // Children in `skip` are ignored (an insert's dry run pretends they are
  // already pruned).
  Node* BestChild(const Node* node, absl::Span<const int32_t> rest,
                  int64_t* common,
                  absl::Span<const Node* const> skip = {}) const;
  // Splits `node` at token `at` (page boundary) and returns the new head.
  Node* Split(Node* node, int64_t at);
  void SetDevicePages(Node* node, std::vector<LogicalPage> pages);
  void ClearDevicePages(Node* node, std::vector<std::vector<LogicalPage>>* out);
  void RemoveLeaf(Node* node);
  // DropLanes helpers (radix_tree_lanes.cc).
  bool MatchBlocked(const Node* node, bool device) const;
  void AbortPendingForLanes(Node* node, LaneDropResult* result);
  void DetachSubtree(Node* top, LaneDropResult* result);
  absl::Status CheckDetached(
      absl::flat_hash_set<LogicalPage>* device_pages,
      std::vector<absl::flat_hash_set<int64_t>>* host_pages) const;
  void RemoveSubtree(Node* node,
                     std::vector<std::vector<int64_t>>* freed_host_pages);
  bool DeviceEvictable(const Node* node) const;
  bool HostEvictable(const Node* node, int64_t now) const;
  // A host copy of a node that is also on device, droppable now.
  bool HostRedundant(const Node* node, int64_t now) const;
  EvictionFacts FactsOf(const Node* node) const;
  // Sets node->first_key and reads its frequency from the sketch (no-op
  // without a sketch).
  void SetFirstKey(Node* node, uint64_t key);
  // After Split: keys `tail` (the former node) by its own first page, after
  // the head's last page keyed `head_last_key`, with the sketch's count for
  // that page. The accesses that went through the whole node were counted at
  // its start, not here: the tail starts over, as the less shared part
  // (measured: inheriting the node's frequency instead loses 0.2 points on
  // the Mooncake trace).
  void KeySplitTail(Node* tail, uint64_t head_last_key);
  // A recorded match of `node`, whose first page has content key `key`:
  // counts it in the sketch and re-reads the node's frequency.
  void RecordAccess(Node* node, uint64_t key);
  EvictionKey KeyOf(const Node* node, EvictionTier tier) const;
  absl::StatusOr<InsertResult> InsertImpl(Node* root,
                                          absl::Span<const int32_t> key,
                                          absl::Span<const LogicalPage> pages,
                                          const InsertOptions& options,
                                          bool dry_run);
  DeviceEvictResult EvictDeviceImpl(absl::Span<const int64_t> per_lane,
                                    int64_t tokens,
                                    const EvictionScope& scope);
  // Eviction in passes (radix_tree_shares.cc): first every namespace at
  // its guarantee is spared, the requester's too; then, if still short, the
  // requester's own pages below its guarantee. On the device tier the first
  // pass only demotes another guaranteed namespace's nodes (those with a host
  // copy), and a second takes its unbacked ones. One pass of each kind;
  // with `demote_only`, a node of a guaranteed namespace other than the
  // scope's requester that holds at most kUncopiedSparedUpTo times its
  // device guarantee is taken only if it has a host copy (the bound keeps
  // uncopied pages, such as those host admission refused, from reserving
  // the pool beyond the guarantee):
  static constexpr int64_t kUncopiedSparedUpTo = 2;
  DeviceEvictResult EvictDevicePass(absl::Span<const int64_t> per_lane,
                                    int64_t tokens,
                                    const EvictionScope& scope,
                                    bool demote_only);
  HostEvictResult EvictHostPass(absl::Span<const int64_t> per_rank,
                                bool redundant_first,
                                int64_t redundant_after_ns,
                                const EvictionScope& scope);
  std::vector<NodeId> DeviceEvictionOrderPass(int64_t max_nodes,
                                              int64_t max_pages,
                                              const EvictionScope& scope) const;
  // Whether `scope`'s requester has a guarantee (a second pass may run).
  bool RequesterGuaranteed(const EvictionScope& scope) const;
  // Namespace tallies: the root of a linked node, and the pages added to
  // (or, negative, taken from) its namespace's tier.
  static Node* RootOf(Node* node);
  static const Node* RootOf(const Node* node);
  static void TallyDevice(Node* node, int64_t pages) {
    RootOf(node)->ns_device_pages += pages;
  }
  static void TallyHost(Node* node, int64_t pages) {
    RootOf(node)->ns_host_pages += pages;
  }
  // Whether `scope` lets eviction take `node`'s pages of `tier`, its
  // namespace having already lost `taken` pages of that tier in a
  // simulation (DeviceEvictionOrder). With `closed`, one pass's set of
  // roots: a namespace whose next victim in the pass's order would take it
  // below its guarantee is closed for the rest of the pass, so it loses
  // only its coldest pages, never hotter smaller ones found after them.
  bool InScope(const Node* node, EvictionTier tier, const EvictionScope& scope,
               int64_t taken = 0,
               absl::flat_hash_set<const Node*>* closed = nullptr) const;
  // Whether a demote-only device pass passes `node` over: it has no host
  // copy (taking it would lose it), and its namespace is guaranteed, not
  // the scope's requester, and holds at most kUncopiedSparedUpTo times its
  // device guarantee.
  bool SparedAsUncopied(const Node* node, const EvictionScope& scope) const;
  // CheckInvariants' part: every root's tallies against a recount.
  absl::Status CheckTallies() const;
  absl::flat_hash_map<std::string, NamespacePages> guarantees_;
  NodeInfo Describe(const Node* node, int depth, int64_t start) const;
  absl::Status CheckNode(const Node* node, int64_t start,
                         TreeStats* totals) const;

  RadixTreeOptions options_;
  uint32_t page_shift_;
  TokenStore tokens_;
  uint64_t next_id_ = 1;
  // node_hash_map: the key strings stay put, roots point at them.
  absl::node_hash_map<std::string, std::unique_ptr<Node>> roots_;
  absl::flat_hash_map<NodeId, Node*> nodes_;  // Every node, roots included.
  int64_t device_tokens_ = 0;
  int64_t protected_tokens_ = 0;
  int64_t host_tokens_ = 0;
  int64_t pending_backups_ = 0;
  // Accesses of recent queries' pages (UsesFrequencySketch policies only).
  std::unique_ptr<FrequencySketch> sketch_;
  // Pages of every node created so far: the clock of Node::last_access_tick.
  int64_t pages_inserted_ = 0;
  // How much later a node seen again (FrequencyClass 1) leaves the host tier
  // than one seen once last accessed at the same tick (EvictionFacts).
  int64_t reuse_credit_ = 0;
  // How long the unshared end of a cached request usually is (with the
  // sketch only).
  TailLearner tails_;
  // Durable host tier (SetHostTierListener).
  HostTierListener* host_listener_ = nullptr;
  // The listener that reads keys after its reports (HoldsKeys), until its
  // owner says it is done (ReleaseKeyHolds), even once detached.
  HostTierListener* key_reader_ = nullptr;
  // Calls made to the listener since it was set (numbered from 1).
  uint64_t reports_ = 0;
  uint64_t next_persist_id_ = 1;
  absl::flat_hash_set<uint64_t> restored_persist_ids_;
  // Lanes of a dead CP member: lanes no match returns, and detached nodes.
  std::vector<bool> unmatchable_lanes_;
  bool any_unmatchable_ = false;
  absl::flat_hash_set<Node*> detached_;
  std::vector<Node*> reapable_;  // Released detached nodes, maybe deletable.

  // KV events: reports what changed in the tiers `node` can serve since it
  // was last announced (stores before removes); `gone`: it is about to be
  // deleted or detached, so it serves nothing.
  void Announce(Node* node, bool gone = false);
  void AnnounceTier(Node* node, Tier tier, TierEvent::Kind kind);
  // Announce (or, `gone`, withdraw) every node of `ns` (nullopt: all).
  void AnnounceEvery(std::optional<absl::string_view> ns, bool gone);
  // The hash of the last whole block before `node` / of its own last one.
  uint64_t ChainStart(Node* node);
  uint64_t ChainEnd(Node* node);
  // Views of `node`'s whole pages (its announced blocks), in page_scratch_.
  void AnnouncedPages(const Node* node);
  // The hashes of `node`'s announced blocks, computed once (with its
  // ancestors' where needed) and kept in the node until it changes.
  const std::vector<uint64_t>& BlockHashesOf(Node* node);
  // Split: `head` (new) and `tail` (the former node) share its
  // announcements and cached hashes.
  void SplitAnnounced(Node* head, Node* tail);
  bool WantsAnnounced(const Node* node, Tier tier) const;
  void ForgetAnnounced();  // Without a report.
  absl::Status CheckAnnounced(const Node* node) const;
  TierListener* tier_listener_ = nullptr;
  uint32_t announce_block_size_ = 0;
  uint64_t hash_seed_ = 0;
  std::vector<absl::Span<const int32_t>> page_scratch_;
  // Blocks smaller than a page: how many nodes announced each block of a
  // first page on each tier (siblings may share them).
  absl::flat_hash_map<std::pair<uint64_t, Tier>, int32_t> shared_blocks_;

  // Frees token blocks of `node`: into quarantine while a key reader may
  // still read them (the node's key was reported past what it has read).
  void FreeKeyBlocks(const Node* node,
                     absl::Span<const TokenStore::BlockId> blocks);
  // The listener hears that `node`'s host copy is gone (before it goes).
  void ReportHostDropped(Node* node);
  // The listener hears that `node` just got its host copy, and that its
  // children with host copies now hang from it.
  void ReportHostCommitted(Node* node);
};

}  // namespace hicache
