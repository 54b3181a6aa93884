#pragma once

// LoopbackCommunicator: two connected in-process ends of one link, for unit
// tests of the layers above comm (daemon/group). Each end is a full
// Communicator (communicator.h) with its own delivery thread, plus test-only
// fault injection:
//  * Break(cause): the link fails on both ends with `cause`, as when the
//    network or the peer dies: frames not delivered yet are dropped.
//  * SetDeliveryHook(hook): `hook` sees each frame just before this end
//    delivers it, on this end's delivery thread (never inside Send/Abort).
//    OK delivers the frame; any other status drops it and Breaks the link
//    with that status. The hook may block to delay delivery (the destructor
//    then waits for it).
//
// Closing one end (Abort or the destructor) is what a peer closing its
// connection looks like to the other end: the survivor first delivers the
// frames that had already reached it, then fails with UNAVAILABLE naming
// the closed end (its Send refuses from the moment of the close).
//
// Semantics shared with the Gloo link (docs/cp-groups.md, "Links"):
//  * Frames reach the peer's inbox at Send() time and wait there until the
//    peer Start()s; none is lost before Start.
//  * on_failure always runs on the end's delivery thread, after the last
//    delivered frame, exactly once; never from Send(), Abort() or Break().
//    An end that fails before Start() never calls it (Start() then returns
//    FAILED_PRECONDITION with the cause).
//
// Thread-safe; the ends may be destroyed in any order, from any thread but
// their own delivery thread. Whatever the callbacks touch must outlive the
// end: its destructor still calls on_failure (CANCELLED) if the link is up.

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/comm/communicator.h"

namespace hicache::comm {

class LoopbackCommunicator final : public Communicator {
 public:
  using DeliveryHook = std::function<absl::Status(absl::string_view frame)>;

  // Two connected ends. `first.peer()` is `second_name` and vice versa.
  static std::pair<std::unique_ptr<LoopbackCommunicator>,
                   std::unique_ptr<LoopbackCommunicator>>
  CreatePair(std::string first_name = "loopback end 0",
             std::string second_name = "loopback end 1");

  ~LoopbackCommunicator() override;
  LoopbackCommunicator(const LoopbackCommunicator&) = delete;
  LoopbackCommunicator& operator=(const LoopbackCommunicator&) = delete;

  absl::Status Start(Receiver receiver, FailureHandler on_failure) override;
  absl::Status Send(std::string frame) override;
  void Abort(const absl::Status& cause) override;
  std::string peer() const override;

  // Test-only fault injection (see the file comment). Break with an OK
  // status is treated as UNKNOWN. Idempotent once the link has failed.
  void Break(const absl::Status& cause);
  void SetDeliveryHook(DeliveryHook hook);

  // Frames sent by the peer and not delivered yet (tests).
  size_t pending() const;

 private:
  struct Link;
  LoopbackCommunicator(std::shared_ptr<Link> link, int side);
  void DeliveryLoop();

  const std::shared_ptr<Link> link_;
  const int side_;  // 0 or 1: this end's slot in link_.
};

}  // namespace hicache::comm
