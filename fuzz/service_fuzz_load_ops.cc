// Ops of //fuzz:service_fuzzer (Run, service_fuzz_run.h) on loads and
// workers: LoadBack (one request or a batch), its end, the FinishLoad RPC,
// Subscribe / its cancel, and RegisterFence / ReleaseFence.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "daemon/engine/worker_subscription.h"
#include "fuzz/service_fuzz_report.h"
#include "fuzz/service_fuzz_run.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::fuzz {

void Run::LoadBackOp() {
  SessionState* s;
  const std::string id = PickSessionId(&s);
  const Tokens tokens = ReadTokens(in_);
  const uint8_t b = in_.Byte();
  v1::LoadBackRequest request;
  request.set_session_id(id);
  request.set_tokens(tokens.Packed());
  absl::Status failed;
  std::unique_ptr<LoadRpc> load =
      StartLoadBack(request, kBacklog, &failed, nullptr);
  Check("LoadBack", failed);
  if (load == nullptr) return;
  if ((b & 2) != 0) {
    // Read to the end (bit 0) or cancel now.
    Check("LoadBack.finish", FinishLoadRpc(*load, (b & 1) != 0));
  } else {
    loads_.push_back(std::move(load));
  }
}

// LoadBack of a batch (items with extend_tokens) or of one request
// (tokens + extend_tokens), or (bits 2 and 7) both at once (refused); then
// the stream is
// live (the server streams after every op), read to the end now,
// cancelled now, or kept for a FinishLoad op; its mailbox may be tiny.
void Run::LoadBatchOp() {
  SessionState* s;
  const std::string id = PickSessionId(&s);
  const uint8_t b = in_.Byte();
  v1::LoadBackRequest request;
  request.set_session_id(id);
  const int items = b & 3;
  if (items == 0) {
    request.set_tokens(ReadTokens(in_).Packed());
    request.set_extend_tokens(TokenCount(in_));
  } else {
    for (int i = 0; i < items; ++i) {
      v1::LoadItem* item = request.add_items();
      item->set_tokens(ReadTokens(in_).Packed());
      item->set_extend_tokens(TokenCount(in_));
    }
    if ((b & 0x84) == 0x84) request.set_tokens(ReadTokens(in_).Packed());
  }
  static constexpr size_t kBacklogs[] = {kBacklog, kBacklog, 4, 1};
  absl::Status failed;
  std::unique_ptr<LoadRpc> load =
      StartLoadBack(request, kBacklogs[(b >> 5) & 3], &failed, nullptr);
  Check("LoadBack(batch)", failed);
  if (load == nullptr) return;
  switch ((b >> 3) & 3) {
    case 0:
      load->live = true;
      loads_.push_back(std::move(load));
      break;
    case 1:
      Check("LoadBack.finish", FinishLoadRpc(*load, /*wait=*/true));
      break;
    case 2:
      Check("LoadBack.cancel", FinishLoadRpc(*load, /*wait=*/false));
      break;
    default:
      loads_.push_back(std::move(load));
      break;
  }
}

// The client of a kept LoadBack reads to the end (bit 0) or cancels.
void Run::FinishLoadOp() {
  const uint8_t b = in_.Byte();
  if (loads_.empty()) return;
  const size_t i = (b >> 1) % loads_.size();
  std::unique_ptr<LoadRpc> load = std::move(loads_[i]);
  loads_.erase(loads_.begin() + static_cast<ptrdiff_t>(i));
  Check("LoadBack.finish", FinishLoadRpc(*load, (b & 1) != 0));
}

// The FinishLoad RPC: a load of this session (maybe still streaming),
// another session's, an unknown one.
void Run::FinishLoadRpcOp() {
  SessionState* s;
  v1::FinishLoadRequest request;
  request.set_session_id(PickSessionId(&s));
  const uint8_t b = in_.Byte();
  uint64_t load = 0;
  if (b < 192 && !load_ids_.empty()) {
    load = load_ids_[b % load_ids_.size()];
  } else if ((b & 1) != 0) {
    load = uint64_t{1} << 40 | b;
  }
  request.set_load_id(load);
  Check("FinishLoad", service_->FinishLoad(request));
}

// Subscribe (a worker session's, a scheduler's, an unknown one), with a
// mailbox of {65536, 65536, 2, 1} events; replaces the slot's previous
// subscription (its client cancels).
void Run::SubscribeOp() {
  SessionState* s;
  int slot;
  const std::string id = PickSessionId(&s, &slot);
  const uint8_t b = in_.Byte();
  static constexpr size_t kBacklogs[] = {kBacklog, kBacklog, 2, 1};
  SubscribeRpc& sub = subs_[std::min(slot, kSlots)];
  sub.stream.reset();
  sub = SubscribeRpc();
  sub.cancelled = std::make_shared<std::atomic<bool>>(false);
  absl::StatusOr<std::unique_ptr<WorkerSubscription>> opened =
      WorkerSubscription::Open(
          service_->Context(kBacklogs[b & 3], sub.cancelled), id);
  Check("Subscribe", opened.status());
  if (!opened.ok()) return;
  sub.stream = *std::move(opened);
  sub.session = id;
  sub.rank = sub.stream->rank();
  auto ns = session_ns_.find(id);
  if (ns != session_ns_.end()) sub.ns = ns->second;
}

void Run::UnsubscribeOp() {
  SubscribeRpc& sub = subs_[in_.Byte() % (kSlots + 1)];
  if (sub.stream != nullptr)
    Trace("    Subscribe of '", sub.session, "' cancelled");
  sub.stream.reset();
}

// RegisterFence (any rank, handles of 64 bytes or not) -- refused on this
// backend, which has no events -- and ReleaseFence of ids never issued.
void Run::FenceOp() {
  SessionState* s;
  const std::string id = PickSessionId(&s);
  const uint8_t b = in_.Byte();
  if ((b & 1) == 0) {
    v1::RegisterFenceRequest request;
    request.set_session_id(id);
    request.set_rank(in_.Byte() % (cp_ + 2));
    static constexpr size_t kSizes[] = {64, 0, 63, 65};
    request.set_event_handle(std::string(kSizes[(b >> 1) & 3], '\x5a'));
    v1::RegisterFenceResponse response;
    const grpc::Status status = service_->RegisterFence(request, &response);
    Check("RegisterFence", status);
    if (status.ok()) {
      Fail(absl::StrCat("RegisterFence answered fence ", response.fence_id(),
                        " on a backend without events"),
           engine_.get());
    }
  } else {
    v1::ReleaseFenceRequest request;
    request.set_session_id(id);
    request.set_fence_id(in_.Byte() % 4);
    Check("ReleaseFence", service_->ReleaseFence(request));
  }
}

}  // namespace hicache::fuzz
