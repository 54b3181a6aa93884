#include "daemon/backend/cuda/nccl_communicator.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cuda_kernels/raw_nccl.h"

namespace hicache {

namespace raw = ::hicache::cuda::raw;

bool NcclCommunicator::Compiled() { return raw::RawNcclCompiled(); }

absl::StatusOr<NcclCommunicator::UniqueIds> NcclCommunicator::NewUniqueIds() {
  static_assert(sizeof(UniqueId) == raw::kRawNcclUniqueIdBytes);
  UniqueIds ids;
  for (UniqueId* id : {&ids.forward, &ids.backward}) {
    if (int e = raw::RawNcclGetUniqueId(id->data()); e != 0) {
      return absl::UnavailableError(absl::StrCat(
          "NCCL unique id: ", raw::RawNcclErrorString(e)));
    }
  }
  return ids;
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Connect(
    const Options& options) {
  if (options.side != 0 && options.side != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL link side ", options.side, " (0 or 1)"));
  }
  constexpr size_t kMaxMessageBytes = size_t{64} << 20;
  if (options.message_bytes < 64 || options.message_bytes > kMaxMessageBytes ||
      options.receive_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL link: message of ", options.message_bytes,
        " bytes (64 to 64 MiB), receive timeout ",
        absl::FormatDuration(options.receive_timeout), " (positive)"));
  }
  if (!raw::RawNcclCompiled()) {
    return absl::UnavailableError(
        "NCCL support was not compiled in (use the Gloo link)");
  }
  void* link = nullptr;
  if (int e = raw::RawNcclLinkOpen(&link, options.ids.forward.data(),
                                   options.ids.backward.data(), options.side,
                                   options.device, options.message_bytes);
      e != 0) {
    return absl::UnavailableError(absl::StrCat(
        "NCCL link to ", options.peer_name, " on GPU ", options.device, ": ",
        raw::RawNcclErrorString(e)));
  }
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(options, link));
}

NcclCommunicator::NcclCommunicator(const Options& options, void* link)
    : options_(options), link_(link), packer_(options.message_bytes) {
  sender_ = std::thread([this] { SendLoop(); });
}

NcclCommunicator::~NcclCommunicator() {
  Fail(absl::CancelledError("the NCCL link was closed"));
  if (sender_.joinable()) sender_.join();
  if (receiver_thread_.joinable()) receiver_thread_.join();
  if (watchdog_.joinable()) watchdog_.join();
  raw::RawNcclLinkClose(link_);
}

absl::Status NcclCommunicator::FromRaw(int code, const char* what) const {
  if (code == raw::kRawNcclAborted) {
    return absl::CancelledError("the NCCL link was aborted");
  }
  return absl::UnavailableError(absl::StrCat(
      "NCCL link to ", options_.peer_name, ": ", what, ": ",
      raw::RawNcclErrorString(code)));
}

absl::Status NcclCommunicator::Start(Receiver receiver,
                                     FailureHandler on_failure) {
  if (!receiver || !on_failure) {
    return absl::InvalidArgumentError(
        "the NCCL link needs a receiver and a failure handler");
  }
  MutexLock lock(&mu_);
  if (started_) {
    return absl::FailedPreconditionError("the NCCL link is started already");
  }
  if (!failure_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the NCCL link failed: ", failure_.ToString()));
  }
  started_ = true;
  receiver_ = std::move(receiver);
  on_failure_ = std::move(on_failure);
  last_receive_ = absl::Now();
  receiver_thread_ = std::thread([this] { ReceiveLoop(); });
  watchdog_ = std::thread([this] { WatchdogLoop(); });
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Send(std::string frame) {
  if (frame.size() > comm::kMaxFrameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame of ", frame.size(), " bytes exceeds ", comm::kMaxFrameBytes));
  }
  MutexLock lock(&mu_);
  if (!failure_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the NCCL link failed: ", failure_.ToString()));
  }
  packer_.Push(std::move(frame));
  send_cv_.Signal();
  return absl::OkStatus();
}

void NcclCommunicator::Abort(const absl::Status& cause) {
  Fail(cause.ok() ? absl::CancelledError("aborted") : cause);
}

void NcclCommunicator::Fail(const absl::Status& cause) {
  {
    MutexLock lock(&mu_);
    if (!failure_.ok()) return;
    failure_ = cause;
  }
  send_cv_.SignalAll();
  watchdog_cv_.SignalAll();
  // Unblocks a Send or Recv waiting for the peer.
  (void)raw::RawNcclLinkAbort(link_);
}

void NcclCommunicator::SendLoop() {
  std::vector<char> message(options_.message_bytes, 0);
  while (true) {
    {
      MutexLock lock(&mu_);
      while (failure_.ok() && packer_.empty()) send_cv_.Wait(&mu_);
      if (!failure_.ok()) return;
      packer_.Pack(message.data());
    }
    if (int e = raw::RawNcclLinkSend(link_, message.data()); e != 0) {
      Fail(FromRaw(e, "send"));
      return;
    }
  }
}

void NcclCommunicator::ReceiveLoop() {
  std::vector<char> message(options_.message_bytes, 0);
  comm::FrameAssembler assembler;
  std::vector<std::string> frames;
  while (true) {
    if (int e = raw::RawNcclLinkRecv(link_, message.data()); e != 0) {
      Fail(FromRaw(e, "receive"));
      break;
    }
    frames.clear();
    if (absl::Status s =
            assembler.Consume(message.data(), message.size(), &frames);
        !s.ok()) {
      Fail(s);
      break;
    }
    Receiver deliver;
    {
      MutexLock lock(&mu_);
      last_receive_ = absl::Now();
      if (!failure_.ok()) break;
      deliver = receiver_;
    }
    bool failed = false;
    for (const std::string& frame : frames) {
      {
        MutexLock lock(&mu_);
        if (!failure_.ok()) break;
      }
      // No exception leaves a Communicator (a receiver that throws, e.g.
      // bad_alloc decoding a frame, fails the link instead).
      try {
        deliver(frame);
      } catch (const std::exception& e) {
        Fail(absl::InternalError(
            absl::StrCat("the NCCL link's receiver threw: ", e.what())));
        failed = true;
        break;
      } catch (...) {
        Fail(absl::InternalError("the NCCL link's receiver threw"));
        failed = true;
        break;
      }
    }
    if (failed) break;
  }
  FailureHandler on_failure;
  absl::Status cause;
  {
    MutexLock lock(&mu_);
    on_failure = std::move(on_failure_);
    cause = failure_;
  }
  if (on_failure) on_failure(cause);
}

void NcclCommunicator::WatchdogLoop() {
  MutexLock lock(&mu_);
  while (failure_.ok()) {
    const absl::Time deadline = last_receive_ + options_.receive_timeout;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      const absl::Status timeout = absl::DeadlineExceededError(absl::StrCat(
          "nothing from ", options_.peer_name, " for ",
          absl::FormatDuration(options_.receive_timeout)));
      mu_.Unlock();
      Fail(timeout);
      mu_.Lock();
      break;
    }
    watchdog_cv_.WaitWithTimeout(&mu_, left);
  }
}

}  // namespace hicache
