#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/engine/event_hub.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"

namespace hicache {

// Whether Admit prepares the per-layer backup of a request's new pages.
enum class BackupChoice {
  kAuto,    // When the engine's write policy is write-through.
  kNever,
  kAlways,  // Unless the host tier has no room (backup id 0).
};

struct AdmitItem {
  std::vector<int32_t> tokens;  // The request's input.
  int64_t reserve_tokens = 0;   // Output tokens to allocate pages for now.
  std::optional<ComputeOwnerMode> mode;  // Lanes of the new pages.
  BackupChoice backup = BackupChoice::kAuto;
  // A middle chunk of a chunked prefill, which Complete will insert
  // unfinished: the tree keeps only its whole pages, so its backup covers
  // only those (a partial tail page could never attach); the next chunk,
  // whose hit ends at that page boundary, backs up the rest.
  bool unfinished = false;
};

struct AdmitResult {
  // false: the item (and every item after it) holds nothing; retry later.
  bool admitted = false;
  // The page-floored device hit, locked for the session (handle 0: no hit).
  SessionManager::SessionMatch hit;
  // The host hit is worth loading (at least the load-back threshold):
  // nothing was allocated; the caller loads it back, then allocates.
  bool load = false;
  // The new pages after hit.match.device_pages: ceil((|tokens| + reserve) /
  // P) - |device_pages| of them.
  std::vector<LogicalPage> pages;
  uint64_t backup_id = 0;  // The prepared backup of the new input pages.
};

struct CompleteItem {
  SessionInsertItem insert;
  std::vector<uint64_t> lock_handles;  // Released after the insert.
  bool free_uncached = false;          // Free what the tree did not take.
  std::vector<LogicalPage> free_pages;  // More pages to free (unused reserve).
};

// One scheduler request in one round trip before its forward (Admit) and
// one after (Complete), built on the session's own calls, so every rule of
// SessionManager (confinement, ownership, limits) holds unchanged.
//
// Admit, item by item in order: match (page-floored: every page the request
// writes starts on a page boundary) and lock the device hit; unless the
// host hit is worth loading, allocate the rest of the request and, per the
// backup choice, choose to back up its new input pages (not when the match
// reports tail_blocked: the insert would be deferred; under write_ahead,
// only if they fit the free host pages with the batch's earlier copies
// counted). The chosen backups are then prepared together: one host
// admission and eviction step for the whole call (seed 001), never one an
// item. The first item that does not fit (RESOURCE_EXHAUSTED) and every
// item after it are not admitted and hold nothing. Any other error undoes
// the whole call.
//
// Complete: first checks every item -- lock handles, pages to free, what
// each insert would refuse (SessionManager::CheckInsert), a handle, page or
// backup named twice -- so a bad item changes nothing at all. Then item by
// item: insert (attaching the backup, as SessionManager::Insert); a deferred
// insert stops there for that item (no unlock, no free: retry it).
// Otherwise the handles are released and, with free_uncached, the uncached
// pages and free_pages freed.
//
// Thread-safe (as SessionManager).
class RequestFlow {
 public:
  // `sessions`, `engine` and `hub` must outlive the flow. Backups Admit
  // prepares are tagged in `hub` with the session's namespace, so the
  // namespace's workers hear their steps and outcomes on Subscribe (nobody
  // else streams them). Without a hub (tests) nobody hears them.
  RequestFlow(SessionManager* sessions, const HiCacheEngine* engine,
              EventHub* hub = nullptr);

  absl::StatusOr<std::vector<AdmitResult>> Admit(
      const std::string& session_id, absl::Span<const AdmitItem> items);
  absl::StatusOr<std::vector<SessionInsertResult>> Complete(
      const std::string& session_id, absl::Span<const CompleteItem> items);

 private:
  // Whether an admitted item with device hit `hit` gets a backup of its new
  // `pages`.
  bool WantsBackup(BackupChoice choice, const MatchResult& hit,
                   absl::Span<const LogicalPage> pages) const;
  // Releases what Admit took for `results` (an error undoes the call).
  void Undo(const std::string& session_id,
            const std::vector<AdmitResult>& results);

  SessionManager* const sessions_;
  const HiCacheEngine* const engine_;
  EventHub* const hub_;
};

}  // namespace hicache
