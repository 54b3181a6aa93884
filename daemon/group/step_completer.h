#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "daemon/core/mutex.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache::group {

// A status with the same code and message but a representation of its own.
// Statuses handed to other threads are copied this way instead of sharing
// one reference-counted representation: Debian's Abseil is not
// TSan-instrumented, so the release of a shared one looks like a race.
inline absl::Status CopyStatus(const absl::Status& status) {
  return absl::Status(status.code(), status.message());
}

// StepCompleter: reports completions that a transfer engine decides itself
// (a link that failed, a rank nobody serves) from its own thread, so that
// Submit never calls the listener synchronously (the engine calls Submit
// with its lock held).
//
// Contract: every StepDone given to Complete is passed to `deliver` exactly
// once, in the order given, on the completer's thread; never inside
// Complete. Drain waits until everything completed so far was delivered and
// `deliver` returned. The destructor delivers what is still queued, then
// joins the thread.
//
// Thread-safe. mu_ is a leaf: `deliver` runs without it, so it may take the
// owner's locks, and the owner may call Complete with its own lock held.
class StepCompleter {
 public:
  using Deliver = std::function<void(StepDone done)>;

  explicit StepCompleter(Deliver deliver);
  ~StepCompleter() ABSL_LOCKS_EXCLUDED(mu_);
  StepCompleter(const StepCompleter&) = delete;
  StepCompleter& operator=(const StepCompleter&) = delete;

  void Complete(std::vector<StepDone> dones) ABSL_LOCKS_EXCLUDED(mu_);
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);
  // Completions delivered so far.
  int64_t delivered() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const Deliver deliver_;
  mutable Mutex mu_;
  CondVar work_cv_;
  CondVar idle_cv_;
  std::deque<StepDone> queue_ ABSL_GUARDED_BY(mu_);
  bool delivering_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t delivered_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // Last: starts after the state above exists.
};

}  // namespace hicache::group
