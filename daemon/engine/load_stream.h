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
#include "daemon/engine/event_mailbox.h"
#include "daemon/engine/stream_context.h"

namespace hicache {

// One LoadBack stream: its loads, their per-layer events and their ends.
// Single-threaded (the RPC's thread). Loads still running when it is
// destroyed are abandoned (their pages freed, nothing attached).
class LoadStream {
 public:
  static absl::StatusOr<std::unique_ptr<LoadStream>> Open(
      StreamContext context, std::string session);
  ~LoadStream();

  // Starts item `item`'s load (SessionManager::LoadBack). With nothing to
  // load (op_id 0) the item is already over: its device hit is locked for
  // the session (lock_handle).
  absl::StatusOr<LoadResult> Start(
      uint32_t item, absl::Span<const int32_t> tokens,
      const HiCacheEngine::LoadBackOptions& options);

  struct Event {
    enum class Kind { kLayer, kDone } kind = Kind::kLayer;
    uint32_t item = 0;
    uint64_t load = 0;
    // kLayer:
    Rank rank = 0;
    uint32_t step = 0;
    std::string fence;
    // kDone: ok means the loaded node is locked for the session under
    // lock_handle (the load's own lock was handed over first).
    bool ok = false;
    uint64_t lock_handle = 0;
  };
  // True while a started load has not ended.
  bool pending() const { return !pending_.empty(); }
  // The next event of a pending load, waiting until `deadline`; nullopt at
  // the deadline or once the stream overflowed.
  std::optional<Event> Next(absl::Time deadline);
  bool overflowed() const { return box_->overflowed(); }

 private:
  LoadStream(StreamContext context, std::string session);

  struct Pending {
    uint32_t item;
    NodeId node;
  };
  const StreamContext context_;
  const std::string session_;
  const std::shared_ptr<EventMailbox> box_;
  std::string ns_;
  std::map<uint64_t, Pending> pending_;  // By load id.
};

}  // namespace hicache
