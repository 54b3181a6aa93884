#include "daemon/engine/load_stream.h"

#include <utility>

#include "daemon/core/log_format.h"
#include "spdlog/spdlog.h"

namespace hicache {

absl::StatusOr<std::unique_ptr<LoadStream>> LoadStream::Open(
    StreamContext context, std::string session) {
  if (absl::Status s = context.sessions->BeginStream(session); !s.ok()) {
    return s;
  }
  return std::unique_ptr<LoadStream>(
      new LoadStream(std::move(context), std::move(session)));
}

LoadStream::LoadStream(StreamContext context, std::string session)
    : context_(std::move(context)),
      session_(std::move(session)),
      box_(std::make_shared<EventMailbox>(context_.max_backlog,
                                          context_.on_overflow)) {
  absl::StatusOr<SessionInfo> info = context_.sessions->Info(session_);
  if (info.ok()) ns_ = info->ns;
}

LoadStream::~LoadStream() {
  // A client that went away, or read too slowly: its loads are abandoned.
  for (const auto& [op, unused] : pending_) {
    context_.hub->Forget(op);
    if (absl::Status s = context_.sessions->FinishLoad(session_, op);
        !s.ok()) {
      spdlog::debug("session {}: abandoning load {}: {}", session_, op, s);
    }
  }
  box_->Disarm();
  context_.sessions->EndStream(session_);
}

absl::StatusOr<LoadResult> LoadStream::Start(
    uint32_t item, absl::Span<const int32_t> tokens,
    const HiCacheEngine::LoadBackOptions& options) {
  absl::StatusOr<LoadResult> load =
      context_.sessions->LoadBack(session_, tokens, options);
  if (!load.ok() || load->op_id == 0) return load;
  context_.hub->Tag(load->op_id, ns_);  // Its workers hear it too.
  context_.hub->Claim(load->op_id, box_);
  pending_[load->op_id] = Pending{item, load->node};
  return load;
}

std::optional<LoadStream::Event> LoadStream::Next(absl::Time deadline) {
  while (!pending_.empty()) {
    std::optional<OpEvent> event = box_->Wait(deadline);
    if (!event.has_value()) return std::nullopt;  // Deadline or overflow.
    auto it = pending_.find(event->op);
    if (it == pending_.end()) continue;
    Event out;
    out.item = it->second.item;
    out.load = event->op;
    if (event->type == OpEvent::Type::kLoadStep) {
      out.kind = Event::Kind::kLayer;
      out.rank = event->rank;
      out.step = event->step;
      out.fence = event->fence;
      return out;
    }
    if (event->type != OpEvent::Type::kLoadDone) continue;
    out.kind = Event::Kind::kDone;
    out.ok = event->ok;
    context_.hub->Forget(event->op);
    // Hand the load's lock over to an ordinary session lock on the node
    // (taken before the load's own lock is released, so the node is never
    // unlocked in between).
    if (out.ok) {
      absl::StatusOr<std::vector<uint64_t>> handles =
          context_.sessions->Lock(session_, {it->second.node});
      if (handles.ok()) {
        out.lock_handle = handles->front();
      } else {
        out.ok = false;  // Never report a hit the session does not hold.
      }
    }
    if (absl::Status s = context_.sessions->FinishLoad(session_, event->op);
        !s.ok()) {
      // The client finished this load itself (FinishLoad) before its done
      // event was read: it abandoned or released it, so nothing is handed
      // over. The lock just taken goes back, and done says ok=false.
      spdlog::debug("session {}: load {} was finished by the client: {}",
                    session_, event->op, s);
      if (out.lock_handle != 0) {
        const uint64_t handle = out.lock_handle;
        if (absl::Status undo = context_.sessions->UnlockHandles(
                session_, absl::MakeConstSpan(&handle, 1));
            !undo.ok()) {
          spdlog::warn("session {}: returning the lock of load {}: {}",
                       session_, event->op, undo);
        }
      }
      out.ok = false;
      out.lock_handle = 0;
    }
    pending_.erase(it);
    return out;
  }
  return std::nullopt;
}

}  // namespace hicache
