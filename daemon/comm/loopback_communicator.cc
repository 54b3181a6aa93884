#include "daemon/comm/loopback_communicator.h"

#include <deque>
#include <exception>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "daemon/core/check.h"
#include "daemon/core/mutex.h"

namespace hicache::comm {

// Both ends share one Link; one mutex guards both, so a Send (which writes the
// peer's inbox) and a failure (which touches both ends) need no lock order.
struct LoopbackCommunicator::Link {
  struct End {
    std::string name;
    std::deque<std::string> inbox;  // Frames from the peer, not delivered.
    bool started = false;
    // Set once, when the link fails for this end. Send refuses from then on.
    std::optional<absl::Status> failure;
    // The failure is the peer closing: deliver the inbox first (those frames
    // had arrived before the close). Otherwise the inbox is dropped.
    bool drain_first = false;
    Receiver receiver;
    FailureHandler on_failure;
    DeliveryHook hook;
    CondVar cv;  // Signalled on a new frame, a failure or Start.
    std::thread thread;
  };

  Mutex mu;
  End ends[2] ABSL_GUARDED_BY(mu);

  // Fails `side` with `cause` unless it already failed.
  void FailLocked(int side, const absl::Status& cause, bool drain_first)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    End& end = ends[side];
    if (end.failure.has_value()) {
      // A later hard failure (Abort/Break) still stops a pending drain.
      if (!drain_first) end.drain_first = false;
      end.cv.SignalAll();
      return;
    }
    end.failure = cause;
    end.drain_first = drain_first;
    if (!drain_first) end.inbox.clear();
    end.cv.SignalAll();
  }
};

namespace {

absl::Status NonOk(const absl::Status& cause) {
  return cause.ok() ? absl::UnknownError("link broken with an OK status")
                    : cause;
}

}  // namespace

std::pair<std::unique_ptr<LoopbackCommunicator>,
          std::unique_ptr<LoopbackCommunicator>>
LoopbackCommunicator::CreatePair(std::string first_name,
                                 std::string second_name) {
  auto link = std::make_shared<Link>();
  {
    MutexLock lock(&link->mu);
    link->ends[0].name = std::move(first_name);
    link->ends[1].name = std::move(second_name);
  }
  return {std::unique_ptr<LoopbackCommunicator>(
              new LoopbackCommunicator(link, 0)),
          std::unique_ptr<LoopbackCommunicator>(
              new LoopbackCommunicator(link, 1))};
}

LoopbackCommunicator::LoopbackCommunicator(std::shared_ptr<Link> link,
                                           int side)
    : link_(std::move(link)), side_(side) {}

LoopbackCommunicator::~LoopbackCommunicator() {
  Abort(absl::CancelledError("loopback communicator destroyed"));
  std::thread thread;
  {
    MutexLock lock(&link_->mu);
    thread = std::move(link_->ends[side_].thread);
  }
  if (thread.joinable()) {
    HICACHE_CHECK(thread.get_id() != std::this_thread::get_id(),
                  "LoopbackCommunicator destroyed from its own callback");
    thread.join();
  }
}

absl::Status LoopbackCommunicator::Start(Receiver receiver,
                                         FailureHandler on_failure) {
  MutexLock lock(&link_->mu);
  Link::End& end = link_->ends[side_];
  if (end.started) {
    return absl::FailedPreconditionError(absl::StrCat(
        "link to ", link_->ends[1 - side_].name, " already started"));
  }
  if (end.failure.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("link to ", link_->ends[1 - side_].name,
                     " failed before Start: ", end.failure->ToString()));
  }
  end.started = true;
  end.receiver = std::move(receiver);
  end.on_failure = std::move(on_failure);
  end.thread = std::thread([this] { DeliveryLoop(); });
  return absl::OkStatus();
}

absl::Status LoopbackCommunicator::Send(std::string frame) {
  if (frame.size() > kMaxFrameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame of ", frame.size(), " bytes exceeds the ",
                     kMaxFrameBytes, "-byte limit of a link"));
  }
  MutexLock lock(&link_->mu);
  Link::End& self = link_->ends[side_];
  Link::End& peer = link_->ends[1 - side_];
  if (self.failure.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "link to ", peer.name, " failed: ", self.failure->ToString()));
  }
  // The peer has not failed either: a failure of one end always fails the
  // other in the same critical section.
  peer.inbox.push_back(std::move(frame));
  peer.cv.Signal();
  return absl::OkStatus();
}

void LoopbackCommunicator::Abort(const absl::Status& cause) {
  MutexLock lock(&link_->mu);
  const int other = 1 - side_;
  const bool first = !link_->ends[side_].failure.has_value();
  link_->FailLocked(side_, NonOk(cause), /*drain_first=*/false);
  if (first) {
    // What a closed connection looks like from the other side.
    link_->FailLocked(
        other,
        absl::UnavailableError(absl::StrCat(
            "peer ", link_->ends[side_].name,
            " closed the link: ", NonOk(cause).ToString())),
        /*drain_first=*/true);
  }
}

std::string LoopbackCommunicator::peer() const {
  MutexLock lock(&link_->mu);
  return link_->ends[1 - side_].name;
}

void LoopbackCommunicator::Break(const absl::Status& cause) {
  MutexLock lock(&link_->mu);
  link_->FailLocked(0, NonOk(cause), /*drain_first=*/false);
  link_->FailLocked(1, NonOk(cause), /*drain_first=*/false);
}

void LoopbackCommunicator::SetDeliveryHook(DeliveryHook hook) {
  MutexLock lock(&link_->mu);
  link_->ends[side_].hook = std::move(hook);
}

size_t LoopbackCommunicator::pending() const {
  MutexLock lock(&link_->mu);
  return link_->ends[side_].inbox.size();
}

void LoopbackCommunicator::DeliveryLoop() {
  Link& link = *link_;
  Receiver receiver;
  FailureHandler on_failure;
  absl::Status cause;
  {
    MutexLock lock(&link.mu);
    receiver = link.ends[side_].receiver;
    on_failure = link.ends[side_].on_failure;
  }
  for (;;) {
    std::string frame;
    DeliveryHook hook;
    {
      MutexLock lock(&link.mu);
      Link::End& end = link.ends[side_];
      for (;;) {
        if (end.failure.has_value() && !end.drain_first) end.inbox.clear();
        if (!end.inbox.empty() || end.failure.has_value()) break;
        end.cv.Wait(&link.mu);
      }
      if (end.inbox.empty()) {
        cause = *end.failure;
        break;
      }
      frame = std::move(end.inbox.front());
      end.inbox.pop_front();
      hook = end.hook;
    }
    absl::Status verdict = absl::OkStatus();
    if (hook) {
      try {
        verdict = hook(frame);
      } catch (const std::exception& e) {
        verdict = absl::InternalError(
            absl::StrCat("loopback delivery hook threw: ", e.what()));
      } catch (...) {
        verdict = absl::InternalError("loopback delivery hook threw");
      }
    }
    if (!verdict.ok()) {
      Break(verdict);
      continue;
    }
    {
      // A failure that raced with the hook: the frame is not delivered.
      MutexLock lock(&link.mu);
      const Link::End& end = link.ends[side_];
      if (end.failure.has_value() && !end.drain_first) continue;
    }
    try {
      if (receiver) receiver(frame);
    } catch (const std::exception& e) {
      Abort(absl::InternalError(
          absl::StrCat("frame receiver threw: ", e.what())));
    } catch (...) {
      Abort(absl::InternalError("frame receiver threw"));
    }
  }
  try {
    if (on_failure) on_failure(cause);
  } catch (...) {
    // Nothing left to report to: the link has already failed.
  }
}

}  // namespace hicache::comm
