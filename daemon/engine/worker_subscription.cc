#include "daemon/engine/worker_subscription.h"

#include <utility>

namespace hicache {

absl::StatusOr<std::unique_ptr<WorkerSubscription>> WorkerSubscription::Open(
    StreamContext context, std::string session) {
  absl::StatusOr<SessionInfo> info = context.sessions->Info(session);
  if (!info.ok()) return info.status();
  if (info->role != SessionRole::kWorker) {
    return absl::PermissionDeniedError(
        "Subscribe needs a worker session (its rank's events)");
  }
  if (absl::Status s = context.sessions->BeginStream(session); !s.ok()) {
    return s;
  }
  auto stream = std::unique_ptr<WorkerSubscription>(new WorkerSubscription(
      std::move(context), std::move(session), info->rank));
  stream->subscription_ =
      stream->context_.hub->Subscribe(info->rank, info->ns, stream->box_);
  return stream;
}

WorkerSubscription::WorkerSubscription(StreamContext context,
                                       std::string session, Rank rank)
    : context_(std::move(context)),
      session_(std::move(session)),
      rank_(rank),
      box_(std::make_shared<EventMailbox>(context_.max_backlog,
                                          context_.on_overflow)) {}

WorkerSubscription::~WorkerSubscription() {
  context_.hub->Unsubscribe(subscription_);
  box_->Disarm();
  context_.sessions->EndStream(session_);
}

std::optional<OpEvent> WorkerSubscription::Next(absl::Time deadline) {
  if (ended_) return std::nullopt;
  std::optional<OpEvent> event = box_->Wait(deadline);
  // Nothing more for a session that ended (closed or lapsed), also while its
  // namespace keeps the mailbox busy.
  if (box_->overflowed() || !context_.sessions->Info(session_).ok()) {
    ended_ = true;
    return std::nullopt;
  }
  if (!event.has_value()) return std::nullopt;  // The deadline.

  if (event->type != OpEvent::Type::kBackupStep &&
      event->type != OpEvent::Type::kLoadStep) {
    event->rank = rank_;  // Outcomes are the op's, stamped for this worker.
  }
  return event;
}

}  // namespace hicache
