#include "daemon/group/wire_link.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/core/log_format.h"
#include "spdlog/spdlog.h"

namespace hicache::group {

WireLink::WireLink(std::unique_ptr<comm::Communicator> comm, uint64_t epoch)
    : comm_(std::move(comm)), epoch_(epoch) {}

WireLink::~WireLink() = default;  // comm_'s destructor joins its threads.

absl::Status WireLink::Start(FrameHandler on_frame, FailureHandler on_failure) {
  on_frame_ = std::move(on_frame);
  return comm_->Start([this](absl::string_view bytes) { OnBytes(bytes); },
                      std::move(on_failure));
}

absl::Status WireLink::Send(const FrameBody& body) {
  MutexLock lock(&send_mu_);
  std::string frame = EncodeFrame(epoch_, next_seq_, body);
  const size_t size = frame.size();
  absl::Status sent = comm_->Send(std::move(frame));
  if (!sent.ok()) return sent;
  ++next_seq_;
  ++frames_sent_;
  bytes_sent_ += static_cast<int64_t>(size);
  return absl::OkStatus();
}

void WireLink::Abort(const absl::Status& cause) {
  {
    MutexLock lock(&recv_mu_);
    broken_ = true;  // Nothing reaches on_frame from now on.
  }
  comm_->Abort(cause);
}

WireLink::Stats WireLink::stats() const {
  Stats s;
  {
    MutexLock lock(&send_mu_);
    s.frames_sent = frames_sent_;
    s.bytes_sent = bytes_sent_;
  }
  MutexLock lock(&recv_mu_);
  s.frames_received = frames_received_;
  s.bytes_received = bytes_received_;
  s.protocol_errors = protocol_errors_;
  return s;
}

void WireLink::ProtocolError(const absl::Status& why) {
  {
    MutexLock lock(&recv_mu_);
    if (broken_) return;
    broken_ = true;
    ++protocol_errors_;
  }
  const absl::Status cause = absl::DataLossError(absl::StrCat(
      "CP group protocol error from ", comm_->peer(), " (epoch ", epoch_,
      "): ", why.ToString()));
  spdlog::error("{}; aborting the link", cause);
  comm_->Abort(cause);
}

void WireLink::OnBytes(absl::string_view bytes) {
  absl::StatusOr<Frame> frame = DecodeFrame(bytes);
  {
    MutexLock lock(&recv_mu_);
    if (broken_) return;
    ++frames_received_;
    bytes_received_ += static_cast<int64_t>(bytes.size());
  }
  if (!frame.ok()) return ProtocolError(frame.status());
  if (frame->header.epoch != epoch_) {
    return ProtocolError(absl::InvalidArgumentError(
        absl::StrCat(FrameKindName(static_cast<uint8_t>(frame->header.kind)),
                     " frame of epoch ", frame->header.epoch,
                     "; this link is epoch ", epoch_)));
  }
  uint64_t expected = 0;
  {
    MutexLock lock(&recv_mu_);
    expected = last_seq_ + 1;
    if (frame->header.seq == expected) last_seq_ = expected;
  }
  if (frame->header.seq != expected) {
    return ProtocolError(absl::InvalidArgumentError(absl::StrCat(
        FrameKindName(static_cast<uint8_t>(frame->header.kind)),
        " frame with sequence number ", frame->header.seq, ", expected ",
        expected)));
  }
  absl::Status accepted = on_frame_(*std::move(frame));
  if (!accepted.ok()) ProtocolError(accepted);
}

}  // namespace hicache::group
