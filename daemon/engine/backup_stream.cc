#include "daemon/engine/backup_stream.h"

#include <utility>

#include "daemon/core/log_format.h"
#include "spdlog/spdlog.h"

namespace hicache {

absl::StatusOr<std::unique_ptr<BackupStream>> BackupStream::Open(
    StreamContext context, std::string session) {
  if (absl::Status s = context.sessions->BeginStream(session); !s.ok()) {
    return s;
  }
  return std::unique_ptr<BackupStream>(
      new BackupStream(std::move(context), std::move(session)));
}

BackupStream::BackupStream(StreamContext context, std::string session)
    : context_(std::move(context)),
      session_(std::move(session)),
      box_(std::make_shared<EventMailbox>(context_.max_backlog,
                                          context_.on_overflow)) {}

BackupStream::~BackupStream() {
  {
    MutexLock lock(&mu_);
    for (uint64_t id : claimed_) context_.hub->Forget(id);
  }
  box_->Disarm();  // Whatever on_overflow touches may go away now.
  context_.sessions->EndStream(session_);
}

absl::StatusOr<std::vector<uint64_t>> BackupStream::Prepare(
    absl::Span<const BackupSpec> specs) {
  absl::StatusOr<std::vector<uint64_t>> ids =
      context_.sessions->PrepareBackups(session_, specs);
  if (!ids.ok()) return ids;
  {
    MutexLock lock(&mu_);
    for (uint64_t id : *ids) {
      if (id == 0) continue;
      open_.insert(id);
      claimed_.insert(id);
    }
  }
  // Tagged for the namespace's workers and claimed before the client can
  // store a layer: no event is missed.
  absl::StatusOr<SessionInfo> info = context_.sessions->Info(session_);
  for (uint64_t id : *ids) {
    if (id == 0) continue;
    if (info.ok()) context_.hub->Tag(id, info->ns);
    context_.hub->Claim(id, box_);
  }
  return ids;
}

absl::Status BackupStream::LayerStored(absl::Span<const uint64_t> backups,
                                       uint32_t step,
                                       absl::Span<const RankFence> fences) {
  return context_.sessions->LayerStored(session_, backups, step, fences);
}

absl::Status BackupStream::StoreAll(uint64_t backup) {
  return context_.sessions->StoreAll(session_, backup);
}

absl::Status BackupStream::Rollback(uint64_t backup) {
  return context_.sessions->Rollback(session_, backup);
}

void BackupStream::EndOfInput(bool broken) {
  // Backups that still need the client can never complete.
  std::vector<uint64_t> doomed;
  {
    MutexLock lock(&mu_);
    reading_ = false;
    for (uint64_t id : open_) {
      absl::StatusOr<bool> waits = context_.engine->BackupAwaitsClient(id);
      if (broken || (waits.ok() && *waits)) doomed.push_back(id);
    }
  }
  for (uint64_t id : doomed) {
    if (absl::Status s = context_.sessions->Rollback(session_, id);
        !s.ok() && s.code() != absl::StatusCode::kInvalidArgument) {
      // INVALID_ARGUMENT: it finished meanwhile (the session forgot it).
      spdlog::warn("stream of session {}: rolling back backup {}: {}",
                   session_, id, s);
    }
  }
  MutexLock lock(&mu_);
  if (open_.empty()) box_->Close();
}

std::optional<OpEvent> BackupStream::NextEvent() {
  while (true) {
    {
      MutexLock lock(&mu_);
      if (finished_) return std::nullopt;
    }
    std::optional<OpEvent> event = box_->Wait(absl::InfiniteFuture());
    if (!event.has_value()) return std::nullopt;  // Closed or overflowed.
    switch (event->type) {
      case OpEvent::Type::kBackupStep:
        return event;
      case OpEvent::Type::kCommitted:
      case OpEvent::Type::kRolledBack: {
        // A backup the engine rolled back after a failed copy is kept (the
        // engine's record and the session's) until the client rolls it back
        // or names it in an insert (backup_attached = false), so its
        // layer_stored and insert still get their defined answers; the
        // session's end releases it otherwise. Anything else is over.
        if (context_.engine->BackupAwaitsClient(event->op).status().code() ==
            absl::StatusCode::kNotFound) {
          context_.sessions->BackupFinished(session_, event->op);
        }
        MutexLock lock(&mu_);
        open_.erase(event->op);
        if (!reading_ && open_.empty()) finished_ = true;  // The last one.
        return event;
      }
      default:
        continue;  // Not a backup's event.
    }
  }
}

}  // namespace hicache
