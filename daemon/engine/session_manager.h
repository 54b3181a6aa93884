#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/core/clock.h"
#include "daemon/core/mutex.h"
#include "daemon/engine/caller.h"
#include "daemon/engine/hicache_engine.h"

namespace hicache {

enum class SessionRole { kScheduler, kWorker };

// What one client may ask for; every limit is checked before any work, and a
// request over it fails with a clear error and changes nothing.
struct SessionLimits {
  int64_t max_sessions = 1024;
  // Distinct namespaces among open sessions.
  int64_t max_namespaces = 256;
  // client_name and namespace, in bytes.
  int64_t max_name_bytes = 256;
  // Items of one Allocate/MatchPrefix/Insert, nodes of one Lock/Unlock,
  // specs of one prepare, backups of one layer_stored.
  int64_t max_items_per_request = 4096;
  // Device pages named or requested by one call, all items together.
  int64_t max_pages_per_request = int64_t{1} << 20;
  // Tokens carried by one call, all items together.
  int64_t max_tokens_per_request = int64_t{1} << 24;
  absl::Duration max_lease = absl::Hours(24);
  absl::Duration max_pin_ttl = absl::Hours(1);
  // Concurrent BackupSession/LoadBack streams of one session.
  int64_t max_streams_per_session = 64;
};

struct SessionInfo {
  std::string id;
  std::string client_name;
  // The principal of the caller that opened it (Caller::principal; empty
  // for one the transport did not identify).
  std::string owner;
  SessionRole role = SessionRole::kScheduler;
  Rank rank = 0;
  std::string ns;
  absl::Duration lease;
};

// What closing (or expiring) a session released.
struct ReleaseSummary {
  int64_t locks = 0;
  int64_t pages = 0;
  int64_t backups = 0;
  int64_t loads = 0;
};

// One allocation request: an exact owner pattern, or `num_pages` in a
// compute-owner mode, or any lanes.
struct AllocationItem {
  int64_t num_pages = 0;
  std::vector<Rank> owners;
  std::optional<ComputeOwnerMode> mode;
};

struct SessionInsertItem {
  std::vector<int32_t> tokens;
  std::vector<LogicalPage> pages;
  bool unfinished = false;
  uint64_t backup_id = 0;
};

struct SessionInsertResult {
  InsertResult insert;
  bool backup_attached = false;
};

// Sessions with leases over the engine. Every lock, allocated page, backup
// and load belongs to the session that made it; Close() and lease expiry
// release all of it (unlock, roll back, finish, free), whether the client
// said goodbye or was killed.
//
// Confinement: a session works only in its own namespace (matching, inserting,
// locking and pinning nodes) and only with its own pages (the engine's page
// ledger), backups and loads; a node of another namespace is NOT_FOUND to it.
// Worker sessions may only keep alive and close; everything else needs a
// scheduler session (PERMISSION_DENIED). The session id is an unguessable
// bearer token; only operators can list sessions (service layer).
//
// Thread-safe. Lock order: SessionManager::mu_ -> HiCacheEngine::mu_.
class SessionManager {
 public:
  // `engine` and `clock` must outlive the manager.
  SessionManager(HiCacheEngine* engine, const Clock* clock,
                 absl::Duration default_lease, SessionLimits limits = {});

  const SessionLimits& limits() const { return limits_; }

  // INVALID_ARGUMENT for a rank not below C, a lease or a name out of
  // bounds; FAILED_PRECONDITION for a worker of a rank whose pools are not
  // in this engine (a CP group's other daemons hold them);
  // RESOURCE_EXHAUSTED past the session or namespace limits.
  // `owner`: the opener's Caller::principal, which CheckCaller compares.
  absl::StatusOr<SessionInfo> Open(std::string client_name, SessionRole role,
                                   Rank rank, std::string ns,
                                   absl::Duration lease,
                                   std::string owner = "")
      ABSL_LOCKS_EXCLUDED(mu_);
  // A session id is not a bearer token: OK if `caller` may use session
  // `id` (an operator, or a caller of the principal that opened it);
  // otherwise NOT_FOUND, the same answer as for an unknown id, so that a
  // leaked or guessed id tells another principal nothing. The service
  // checks this before every call that names a session.
  absl::Status CheckCaller(const std::string& id, const Caller& caller) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // NOT_FOUND for an unknown (or expired) session.
  absl::StatusOr<absl::Duration> KeepAlive(const std::string& id)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<ReleaseSummary> Close(const std::string& id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Closes every session whose lease has lapsed; returns how many.
  int ExpireLapsed() ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<std::vector<std::vector<LogicalPage>>> Allocate(
      const std::string& id, absl::Span<const AllocationItem> items)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Free(const std::string& id, absl::Span<const LogicalPage> pages)
      ABSL_LOCKS_EXCLUDED(mu_);
  // With `lock`, each device hit is matched and locked atomically (no
  // eviction in between) and gets a lock handle (0 when nothing was hit).
  struct SessionMatch {
    MatchResult match;
    uint64_t lock_handle = 0;
  };
  // `exact_tail` false floors an exact sub-page tail hit (MatchOptions).
  absl::StatusOr<std::vector<SessionMatch>> Match(
      const std::string& id, absl::Span<const std::vector<int32_t>> requests,
      bool lock, bool peek = false, bool exact_tail = true)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<SessionInsertResult>> Insert(
      const std::string& id, absl::Span<const SessionInsertItem> items)
      ABSL_LOCKS_EXCLUDED(mu_);
  // What Insert would refuse for any item (its page count, a page that is
  // neither the session's nor the tree's at its matched position, a backup
  // that is not the session's), and a session page or backup named by two
  // items; nothing changes. So a batch checked here inserts all its items.
  absl::Status CheckInsert(const std::string& id,
                           absl::Span<const SessionInsertItem> items)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Locks: every lock a session takes (MatchPrefix with lock, Lock, a
  // load's hand-over) has its own handle, so two requests that hit one node
  // hold two handles and release them independently.
  //
  // Returns one handle per node, in order (all or nothing).
  absl::StatusOr<std::vector<uint64_t>> Lock(const std::string& id,
                                             absl::Span<const NodeId> nodes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Releases one lock per listed node (any of the session's handles on it);
  // FAILED_PRECONDITION, nothing released, if the session holds fewer.
  absl::Status Unlock(const std::string& id, absl::Span<const NodeId> nodes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Releases exactly these locks. INVALID_ARGUMENT for a repeated handle,
  // NOT_FOUND for one the session does not hold; nothing released then.
  absl::Status UnlockHandles(const std::string& id,
                             absl::Span<const uint64_t> handles)
      ABSL_LOCKS_EXCLUDED(mu_);
  // What UnlockHandles would answer, without releasing anything.
  absl::Status CheckHandles(const std::string& id,
                            absl::Span<const uint64_t> handles) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // OK if the pages are distinct and all held by the session (as Free
  // needs); INVALID_ARGUMENT naming the first that is not.
  absl::Status CheckPages(const std::string& id,
                          absl::Span<const LogicalPage> pages) const
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<uint64_t>> PrepareBackups(
      const std::string& id, absl::Span<const BackupSpec> specs)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A scheduler session stores its own backups for every served rank. A
  // worker session stores its own rank's share (HiCacheEngine::
  // RankLayerStored) of backups prepared by schedulers of its namespace, so
  // workers ack their layers without a relay through the scheduler; a
  // worker names at most its own rank's fence. `fences` must be registered
  // by sessions of this session's namespace (NOT_FOUND otherwise, nothing
  // submitted).
  absl::Status LayerStored(const std::string& id,
                           absl::Span<const uint64_t> backups, uint32_t step,
                           absl::Span<const RankFence> fences = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  // A CP group follower's worker ack, relayed to the leader (docs/
  // cp-groups.md, "Worker events and acks across the link"): exactly what a
  // local worker session of namespace `ns` and rank `rank` may store with
  // LayerStored and no fence -- every op must be a backup prepared by a
  // scheduler session of `ns` (INVALID_ARGUMENT naming the first that is
  // not, nothing submitted), at most max_items_per_request ops; then
  // HiCacheEngine::RankLayerStored.
  absl::Status NamespaceLayerStored(const std::string& ns, Rank rank,
                                    absl::Span<const uint64_t> backups,
                                    uint32_t step) ABSL_LOCKS_EXCLUDED(mu_);
  // Worker fences (backends with events): any session (a worker's, usually)
  // registers its "layer written" event for `rank`; the fence lives until
  // ReleaseFence or the session ends. RESOURCE_EXHAUSTED past
  // kMaxFencesPerSession; the engine's errors otherwise (FAILED_PRECONDITION
  // on the CPU backend, INVALID_ARGUMENT for a bad rank or handle).
  static constexpr int64_t kMaxFencesPerSession = 64;
  absl::StatusOr<uint64_t> RegisterFence(const std::string& id, Rank rank,
                                         const std::string& handle)
      ABSL_LOCKS_EXCLUDED(mu_);
  // NOT_FOUND for a fence this session did not register.
  absl::Status ReleaseFence(const std::string& id, uint64_t fence)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status StoreAll(const std::string& id, uint64_t backup)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Rollback(const std::string& id, uint64_t backup)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A load-back owned by the session; its lock is the session's until
  // FinishLoad (or the session ends).
  absl::StatusOr<LoadResult> LoadBack(
      const std::string& id, absl::Span<const int32_t> tokens,
      const HiCacheEngine::LoadBackOptions& options = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status FinishLoad(const std::string& id, uint64_t load)
      ABSL_LOCKS_EXCLUDED(mu_);
  // `ttl` in [0, max_pin_ttl]; zero unpins.
  absl::Status Pin(const std::string& id, NodeId node, absl::Duration ttl)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The stream saw `backup` commit or roll back: the session forgets it.
  void BackupFinished(const std::string& id, uint64_t backup)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A stream (BackupSession, LoadBack) of the session starts / ends.
  // RESOURCE_EXHAUSTED past max_streams_per_session.
  absl::Status BeginStream(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  void EndStream(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);

  // Called with ("session_opened" | "session_closed" | "session_expired",
  // session id) while the manager's lock is held: it must not call back into
  // the manager. Set before use.
  void SetObserver(
      std::function<void(absl::string_view, const std::string&)> o) {
    observer_ = std::move(o);
  }

  struct Totals {
    int64_t sessions = 0;
    int64_t locks = 0;
    int64_t pages = 0;
  };
  Totals totals() const ABSL_LOCKS_EXCLUDED(mu_);
  // Open sessions and their streams per role, and per namespace the open
  // sessions and the device pages they hold (for metrics;
  // session_census.cc).
  struct NamespaceSessions {
    int64_t sessions = 0;
    int64_t pages = 0;
  };
  struct Census {
    int64_t scheduler_sessions = 0;
    int64_t worker_sessions = 0;
    int64_t scheduler_streams = 0;
    int64_t worker_streams = 0;
    int64_t locks = 0;
    absl::flat_hash_map<std::string, NamespaceSessions> namespaces;
  };
  Census TakeCensus() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<SessionInfo> List() const ABSL_LOCKS_EXCLUDED(mu_);
  // One session's info; NOT_FOUND for an unknown session.
  absl::StatusOr<SessionInfo> Info(const std::string& id) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Session {
    SessionInfo info;
    uint64_t holder = 0;  // The session's page holder id in the engine.
    absl::Time deadline;
    absl::flat_hash_map<NodeId, int64_t> locks;  // Node -> count.
    // Handle -> node; each node has locks[node] handles.
    absl::flat_hash_map<uint64_t, NodeId> lock_handles;
    absl::flat_hash_set<uint64_t> backups;
    size_t backup_prune_at = 64;  // Size at which finished ones are dropped.
    absl::flat_hash_set<uint64_t> loads;
    absl::flat_hash_set<uint64_t> fences;
    int64_t streams = 0;
  };

  absl::StatusOr<Session*> Find(const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Find() for calls that need a scheduler session (`what` names the call).
  absl::StatusOr<Session*> FindScheduler(const std::string& id,
                                         absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK if `node` is a live node of the session's namespace; NOT_FOUND (the
  // same answer as for a missing node) otherwise.
  absl::Status CheckNodeInNamespace(const Session& session, NodeId node,
                                    absl::string_view field) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckItems(size_t count, absl::string_view what) const;
  // Whether a session of namespace `ns` prepared `backup` (what a worker of
  // that namespace may ack).
  bool NamespaceOwnsBackupLocked(const std::string& ns, uint64_t backup) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckHandlesLocked(const Session& session,
                                  absl::Span<const uint64_t> handles) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a lock the engine granted; returns its handle.
  uint64_t AddLockLocked(Session& session, NodeId node)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the lock `handle` of `node` (the engine lock is released by the
  // caller).
  void DropLockLocked(Session& session, NodeId node, uint64_t handle)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases the session and forgets its namespace if nothing else uses it.
  void EraseLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ReleaseSummary ReleaseLocked(Session& session)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::function<void(absl::string_view, const std::string&)> observer_;
  HiCacheEngine* const engine_;
  const Clock* const clock_;
  const absl::Duration default_lease_;
  const SessionLimits limits_;
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  // Namespace of the session that registered each live fence.
  absl::flat_hash_map<uint64_t, std::string> fence_ns_ ABSL_GUARDED_BY(mu_);
  // Open sessions per namespace.
  absl::flat_hash_map<std::string, int64_t> namespaces_ ABSL_GUARDED_BY(mu_);
  // Holder ids start at 1: 0 is the engine's in-process default holder.
  uint64_t next_session_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_lock_handle_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace hicache
