#pragma once

// InMemoryRendezvousKv: the bounded RendezvousKv (join_handler.h) a CP
// group's leader serves to its members over the CpGroup RPCs
// (docs/cp-groups.md, "Bootstrap: Join and rendezvous").
//
// Its callers are remote and untrusted, so everything is bounded: key
// length, value size, the number of keys, the total bytes held, how long
// one Get may wait and how many Gets may wait at once. A request over a
// bound is refused with RESOURCE_EXHAUSTED and changes nothing.
//
// Keys of one link live under its prefix ("cp/<group>/<epoch>/<member>/");
// EraseUnderPrefix reclaims them once the link has connected or died, so a
// group that readmits members forever holds only the live links' keys.
//
// A waiting Get blocks on a condition variable (no polling) until its key
// is set, its wait elapses, or Shutdown. Thread-safe.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/core/mutex.h"
#include "daemon/group/join_handler.h"

namespace hicache::group {

struct RendezvousKvLimits {
  size_t max_key_bytes = 512;
  size_t max_value_bytes = size_t{64} << 10;
  size_t max_keys = 4096;
  // Keys and values of every entry together.
  size_t max_total_bytes = size_t{16} << 20;
  // A longer wait is cut to this.
  absl::Duration max_wait = absl::Seconds(60);
  size_t max_waiters = 64;
};

class InMemoryRendezvousKv final : public RendezvousKv {
 public:
  explicit InMemoryRendezvousKv(RendezvousKvLimits limits = {});
  // Wakes the waiters (Shutdown) and waits for them to leave.
  ~InMemoryRendezvousKv() override;
  InMemoryRendezvousKv(const InMemoryRendezvousKv&) = delete;
  InMemoryRendezvousKv& operator=(const InMemoryRendezvousKv&) = delete;

  absl::Status Set(absl::string_view key, absl::string_view value) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration wait) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // Removes every key starting with `prefix` (non-empty); returns how many.
  size_t EraseUnderPrefix(absl::string_view prefix) ABSL_LOCKS_EXCLUDED(mu_);

  // Waiting and later Gets return CANCELLED; later Sets too.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  size_t num_keys() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t total_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t num_waiters() const ABSL_LOCKS_EXCLUDED(mu_);

  const RendezvousKvLimits& limits() const { return limits_; }

 private:
  absl::Status CheckKey(absl::string_view key) const;

  const RendezvousKvLimits limits_;
  mutable Mutex mu_;
  CondVar changed_;  // A key was set, or Shutdown, or a waiter left.
  std::map<std::string, std::string, std::less<>> entries_ ABSL_GUARDED_BY(mu_);
  size_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t waiters_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hicache::group
