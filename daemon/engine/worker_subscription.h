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

// A worker session's Subscribe stream: its rank's per-layer events and
// every backup and load outcome of its namespace. Single-threaded.
class WorkerSubscription {
 public:
  // PERMISSION_DENIED for a scheduler session.
  static absl::StatusOr<std::unique_ptr<WorkerSubscription>> Open(
      StreamContext context, std::string session);
  ~WorkerSubscription();

  Rank rank() const { return rank_; }
  // The next event (outcomes stamped with this worker's rank), waiting
  // until `deadline`; nullopt at the deadline, and for good once the stream
  // overflowed or the session ended (check ended()).
  std::optional<OpEvent> Next(absl::Time deadline);
  bool ended() const { return ended_; }
  bool overflowed() const { return box_->overflowed(); }

 private:
  WorkerSubscription(StreamContext context, std::string session, Rank rank);

  const StreamContext context_;
  const std::string session_;
  const Rank rank_;
  const std::shared_ptr<EventMailbox> box_;
  uint64_t subscription_ = 0;
  bool ended_ = false;
};

}  // namespace hicache
