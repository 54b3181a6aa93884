#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "daemon/core/mutex.h"
#include "daemon/engine/engine_types.h"

namespace hicache {

// One event of a backup or load, as streamed to clients.
struct OpEvent {
  enum class Type {
    kBackupStep,
    kCommitted,
    kRolledBack,
    kLoadStep,
    kLoadDone
  };
  Type type = Type::kBackupStep;
  uint64_t op = 0;
  Rank rank = 0;
  uint32_t step = 0;
  NodeId node = kNoNode;
  bool ok = true;
};

// Collects engine events per operation until a stream takes them, so events
// that arrive before the stream subscribes are not lost. Events of at most
// kMaxOps operations are kept (oldest operations dropped first), so ops that
// nobody streams (write-through backups) cannot grow it without bound.
// Thread-safe.
class EventHub final : public EngineListener {
 public:
  static constexpr size_t kMaxOps = 4096;

  void OnBackupStep(uint64_t op, Rank rank, uint32_t step) override;
  void OnBackupCommitted(uint64_t op, NodeId node) override;
  void OnBackupRolledBack(uint64_t op) override;
  void OnLoadStep(uint64_t op, Rank rank, uint32_t step) override;
  void OnLoadDone(uint64_t op, bool ok) override;

  // The next event of `op`, waiting up to `timeout`; nullopt on timeout.
  std::optional<OpEvent> Next(uint64_t op, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Drops everything still queued for `op`.
  void Forget(uint64_t op) ABSL_LOCKS_EXCLUDED(mu_);
  // Also hands every event to `observer` (operators' Watch). Set before use.
  void SetObserver(std::function<void(const OpEvent&)> observer) {
    observer_ = std::move(observer);
  }

 private:
  void Push(OpEvent event) ABSL_LOCKS_EXCLUDED(mu_);

  std::function<void(const OpEvent&)> observer_;
  Mutex mu_;
  CondVar cv_;
  absl::flat_hash_map<uint64_t, std::deque<OpEvent>> queues_
      ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> order_ ABSL_GUARDED_BY(mu_);  // Ops, first seen first.
};

}  // namespace hicache
