#include "daemon/comm/gloo_communicator.h"

#include <net/if.h>
#include <signal.h>

#include <exception>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "daemon/core/check.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"

namespace hicache::comm {
namespace {

// Gloo waits add their timeout to now(): keep it far from overflowing.
constexpr absl::Duration kMaxTimeout = absl::Hours(24);

bool IsTimeout(absl::string_view what) {
  const std::string lower = absl::AsciiStrToLower(what);
  return absl::StrContains(lower, "timeout") ||
         absl::StrContains(lower, "timed out");
}

// Gloo's exceptions as a status: IoException is the connection (UNAVAILABLE)
// or a timeout (DEADLINE_EXCEEDED); anything else (EnforceNotMet, invalid
// operation) is INTERNAL.
absl::Status StatusFromGloo(const std::exception& e, absl::string_view where) {
  const std::string message = absl::StrCat(where, ": ", e.what());
  if (dynamic_cast<const gloo::IoException*>(&e) != nullptr) {
    if (IsTimeout(e.what())) return absl::DeadlineExceededError(message);
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

absl::Status NonOk(const absl::Status& cause) {
  return cause.ok() ? absl::UnknownError("link aborted with an OK status")
                    : cause;
}

// Gloo writes to its sockets with writev(2) (also from its event-loop
// thread) and handles EPIPE, so it needs SIGPIPE ignored: otherwise writing
// to a peer that has just reset the connection kills the process. Ignores
// it unless the process installed a handler of its own (hicached ignores it
// already).
void IgnoreSigpipe() {
  struct sigaction current = {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_DFL) {
    struct sigaction ignore = {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, nullptr);
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<gloo::transport::Device>>
GlooCommunicator::CreateTcpDevice(const std::string& bind) {
  if (bind.empty()) {
    return absl::InvalidArgumentError(
        "CP group bind address is empty: name an interface or a host");
  }
  IgnoreSigpipe();
  gloo::transport::tcp::attr attr;
  if (if_nametoindex(bind.c_str()) != 0) {
    attr.iface = bind;
  } else {
    attr.hostname = bind;
  }
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot create a Gloo TCP device on '", bind, "': ", e.what()));
  }
}

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Connect(
    GlooLinkOptions options) {
  if (options.store == nullptr) {
    return absl::InvalidArgumentError("Gloo link: no rendezvous store");
  }
  if (options.device == nullptr) {
    return absl::InvalidArgumentError("Gloo link: no TCP device");
  }
  if (options.rank != 0 && options.rank != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Gloo link: rank ", options.rank, " (a link has ranks 0 and 1)"));
  }
  if (options.key_prefix.empty()) {
    return absl::InvalidArgumentError("Gloo link: empty rendezvous key prefix");
  }
  for (const absl::Duration d :
       {options.connect_timeout, options.receive_timeout}) {
    if (d < absl::Milliseconds(1) || d > kMaxTimeout) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Gloo link: timeout ", absl::FormatDuration(d),
          " outside [1ms, 24h]"));
    }
  }
  std::string peer_name =
      options.peer_name.empty()
          ? absl::StrCat("rank ", 1 - options.rank, " of ", options.key_prefix)
          : options.peer_name;

  std::shared_ptr<gloo::rendezvous::Context> context;
  try {
    context = std::make_shared<gloo::rendezvous::Context>(options.rank, 2);
    // Bounds the store waits and the connection (its accept phase: 5x).
    context->setTimeout(absl::ToChronoMilliseconds(options.connect_timeout));
    gloo::rendezvous::PrefixStore store(options.key_prefix, *options.store);
    std::shared_ptr<gloo::transport::Device> device = options.device;
    context->connectFullMesh(store, device);
  } catch (const std::exception& e) {
    return StatusFromGloo(e, absl::StrCat("connecting to ", peer_name));
  }

  std::unique_ptr<GlooCommunicator> link(new GlooCommunicator(
      std::move(context), options.rank, options.receive_timeout,
      std::move(peer_name)));
  try {
    link->send_buffer_ = link->context_->createUnboundBuffer(
        link->send_memory_.data(), link->send_memory_.size());
    link->recv_buffer_ = link->context_->createUnboundBuffer(
        link->recv_memory_.data(), link->recv_memory_.size());
  } catch (const std::exception& e) {
    return StatusFromGloo(
        e, absl::StrCat("link to ", link->peer_name_, ": buffers"));
  }
  try {
    MutexLock lock(&link->mu_);
    link->sender_ = std::thread([raw = link.get()] { raw->SendLoop(); });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("link to ", link->peer_name_, ": sender thread: ",
                     e.what()));
  }
  return link;
}

GlooCommunicator::GlooCommunicator(
    std::shared_ptr<gloo::rendezvous::Context> context, int rank,
    absl::Duration receive_timeout, std::string peer_name)
    : context_(std::move(context)),
      peer_rank_(1 - rank),
      my_slot_(MessageSlot(rank)),
      peer_slot_(MessageSlot(1 - rank)),
      timeout_(absl::ToChronoMilliseconds(receive_timeout)),
      peer_name_(std::move(peer_name)),
      send_memory_(kMessageBytes),
      recv_memory_(kMessageBytes) {}

GlooCommunicator::~GlooCommunicator() {
  Abort(absl::CancelledError(
      absl::StrCat("link to ", peer_name_, ": communicator destroyed")));
  std::thread sender, receiver;
  {
    MutexLock lock(&mu_);
    sender = std::move(sender_);
    receiver = std::move(receiver_);
  }
  for (std::thread* t : {&sender, &receiver}) {
    if (!t->joinable()) continue;
    HICACHE_CHECK(t->get_id() != std::this_thread::get_id(),
                  "GlooCommunicator destroyed from its own callback");
    t->join();
  }
  // The buffers go before the context (members in reverse order); the
  // context's destruction closes what is left of the connection.
}

absl::Status GlooCommunicator::Start(Receiver receiver,
                                     FailureHandler on_failure) {
  MutexLock lock(&mu_);
  if (started_) {
    return absl::FailedPreconditionError(
        absl::StrCat("link to ", peer_name_, " already started"));
  }
  if (failure_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("link to ", peer_name_,
                     " failed before Start: ", failure_->ToString()));
  }
  try {
    receiver_ = std::thread(
        [this, receiver = std::move(receiver),
         on_failure = std::move(on_failure)]() mutable {
          ReceiveLoop(std::move(receiver), std::move(on_failure));
        });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "link to ", peer_name_, ": receiver thread: ", e.what()));
  }
  started_ = true;
  return absl::OkStatus();
}

absl::Status GlooCommunicator::Send(std::string frame) {
  if (frame.size() > kMaxFrameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame of ", frame.size(), " bytes exceeds the ",
                     kMaxFrameBytes, "-byte limit of a link"));
  }
  MutexLock lock(&mu_);
  if (failure_.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "link to ", peer_name_, " failed: ", failure_->ToString()));
  }
  outbox_.push_back(std::move(frame));
  if (outbox_.size() == 1) send_cv_.Signal();
  return absl::OkStatus();
}

void GlooCommunicator::Abort(const absl::Status& cause) { Fail(NonOk(cause)); }

void GlooCommunicator::Fail(const absl::Status& cause) {
  {
    MutexLock lock(&mu_);
    if (failure_.has_value()) return;
    failure_ = cause;
    outbox_.clear();
    send_cv_.SignalAll();
  }
  // Only the first failure gets here. The aborts are sticky: a thread not
  // waiting yet returns from its next wait at once.
  try {
    if (recv_buffer_ != nullptr) recv_buffer_->abortWaitRecv();
    if (send_buffer_ != nullptr) send_buffer_->abortWaitSend();
  } catch (const std::exception&) {
    // Unblocking is best effort; closing below fails the waits as well.
  }
  try {
    // A hard close (RST): the peer fails at once with UNAVAILABLE.
    context_->closeConnections();
  } catch (const std::exception&) {
    // Already closed by Gloo itself (peer death, timeout).
  }
}

void GlooCommunicator::SendLoop() {
  MessagePacker packer(kMessageBytes);
  for (;;) {
    {
      MutexLock lock(&mu_);
      while (!failure_.has_value() && outbox_.empty() && packer.empty()) {
        send_cv_.Wait(&mu_);
      }
      if (failure_.has_value()) return;
      for (std::string& frame : outbox_) packer.Push(std::move(frame));
      outbox_.clear();
    }
    const size_t bytes = packer.Pack(send_memory_.data());
    try {
      send_buffer_->send(peer_rank_, my_slot_, 0, bytes);
      if (!send_buffer_->waitSend(nullptr, timeout_)) return;  // Aborted.
    } catch (const std::exception& e) {
      Fail(StatusFromGloo(e, absl::StrCat("link to ", peer_name_, ": send")));
      return;
    }
  }
}

void GlooCommunicator::ReceiveLoop(Receiver receiver,
                                   FailureHandler on_failure) {
  ReceiveUntilFailure(receiver);
  absl::Status cause;
  {
    MutexLock lock(&mu_);
    cause = failure_.value_or(absl::InternalError("link ended without cause"));
  }
  try {
    if (on_failure) on_failure(cause);
  } catch (...) {
    // Nothing left to report to: the link has already failed.
  }
}

void GlooCommunicator::ReceiveUntilFailure(const Receiver& receiver) {
  const std::string where = absl::StrCat("link to ", peer_name_, ": receive");
  // Posted with the whole buffer: a longer message would abort the process
  // on Gloo's event-loop thread.
  auto post = [&]() -> absl::Status {
    try {
      recv_buffer_->recv(peer_rank_, peer_slot_, 0, recv_memory_.size());
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return StatusFromGloo(e, where);
    }
  };
  if (absl::Status s = post(); !s.ok()) return Fail(s);
  FrameAssembler assembler;
  std::vector<std::string> frames;
  for (;;) {
    {
      MutexLock lock(&mu_);
      if (failure_.has_value()) return;
    }
    try {
      if (!recv_buffer_->waitRecv(nullptr, timeout_)) {
        return Fail(absl::CancelledError(where + " aborted"));  // No-op.
      }
    } catch (const std::exception& e) {
      return Fail(StatusFromGloo(e, where));
    }
    frames.clear();
    absl::Status parsed = assembler.Consume(recv_memory_.data(),
                                            recv_memory_.size(), &frames);
    if (!parsed.ok()) {
      return Fail(absl::DataLossError(absl::StrCat(
          "link to ", peer_name_, ": ", parsed.message())));
    }
    // Repost before delivering (the peer may send the next message while
    // these frames are handled); a failure to repost is reported after the
    // frames that had arrived.
    const absl::Status reposted = post();
    for (std::string& frame : frames) {
      {
        MutexLock lock(&mu_);
        if (failure_.has_value()) return;
      }
      try {
        if (receiver) receiver(frame);
      } catch (const std::exception& e) {
        return Fail(absl::InternalError(absl::StrCat(
            "link to ", peer_name_, ": frame receiver threw: ", e.what())));
      } catch (...) {
        return Fail(absl::InternalError(
            absl::StrCat("link to ", peer_name_, ": frame receiver threw")));
      }
    }
    if (!reposted.ok()) return Fail(reposted);
  }
}

}  // namespace hicache::comm
