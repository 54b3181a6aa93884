#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/core/mutex.h"
#include "daemon/engine/event_mailbox.h"
#include "daemon/engine/stream_context.h"

namespace hicache {

// One BackupSession stream: the backups it prepared and their events.
//
// A reader thread calls the client-message methods and finally EndOfInput;
// one writer thread calls NextEvent until it returns nullopt. When the
// client stops sending, backups that still need it (a layer not stored, no
// node attached) are rolled back -- all of them if the stream broke -- and
// the others' outcomes are still delivered before NextEvent ends.
//
// Thread-safe as described. Destroy only after both threads are done.
class BackupStream {
 public:
  // RESOURCE_EXHAUSTED past the session's stream limit; NOT_FOUND for an
  // unknown session.
  static absl::StatusOr<std::unique_ptr<BackupStream>> Open(
      StreamContext context, std::string session);
  ~BackupStream();  // Forgets its operations; the session's stream ends.

  const std::string& session() const { return session_; }

  // Client messages (SessionManager's rules apply unchanged). Prepared
  // backups are announced to the namespace's workers and claimed by this
  // stream before the ids are returned, so no event is missed.
  absl::StatusOr<std::vector<uint64_t>> Prepare(
      absl::Span<const BackupSpec> specs) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status LayerStored(absl::Span<const uint64_t> backups, uint32_t step,
                           absl::Span<const RankFence> fences)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status StoreAll(uint64_t backup);
  absl::Status Rollback(uint64_t backup);

  // The client is done: it half-closed (`broken` false) or the stream broke
  // (cancelled, bad message; `broken` true).
  void EndOfInput(bool broken) ABSL_LOCKS_EXCLUDED(mu_);

  // The next step_done / committed / rolled_back of this stream's backups,
  // blocking; nullopt once input ended and every outcome was delivered, or
  // the stream overflowed.
  std::optional<OpEvent> NextEvent() ABSL_LOCKS_EXCLUDED(mu_);
  bool overflowed() const { return box_->overflowed(); }

 private:
  BackupStream(StreamContext context, std::string session);

  const StreamContext context_;
  const std::string session_;
  const std::shared_ptr<EventMailbox> box_;
  Mutex mu_;
  std::set<uint64_t> open_ ABSL_GUARDED_BY(mu_);     // Outcome not delivered.
  std::set<uint64_t> claimed_ ABSL_GUARDED_BY(mu_);  // Claimed in the hub.
  bool reading_ ABSL_GUARDED_BY(mu_) = true;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hicache
