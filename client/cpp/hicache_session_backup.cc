// BackupStream (hicache_session.h): the session's BackupSession bidi stream.

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/hicache_session.h"
#include "client/cpp/leader_redirect.h"

namespace hicache::client {

BackupStream::~BackupStream() {
  if (stream_ == nullptr || finished_) return;
  context_.TryCancel();
  v1::BackupServerMessage ignored;
  while (stream_->Read(&ignored)) {
  }
  (void)stream_->Finish();
}

absl::Status BackupStream::Write(v1::BackupClientMessage& message) {
  message.set_session_id(session_id_);
  absl::MutexLock lock(&write_mu_);
  if (writes_done_) {
    return absl::FailedPreconditionError("BackupSession: already closed");
  }
  if (!stream_->Write(message)) {
    return absl::UnavailableError(
        "BackupSession: the stream is broken (read it for the daemon's "
        "status)");
  }
  return absl::OkStatus();
}

void BackupStream::Apply(const v1::BackupServerMessage& message) {
  absl::MutexLock lock(&state_mu_);
  switch (message.message_case()) {
    case v1::BackupServerMessage::kStepDone:
      ++progress_[message.step_done().backup_id()].steps_done;
      break;
    case v1::BackupServerMessage::kCommitted: {
      BackupProgress& p = progress_[message.committed().backup_id()];
      p.committed = true;
      p.node = message.committed().node();
      break;
    }
    case v1::BackupServerMessage::kRolledBack:
      progress_[message.rolled_back().backup_id()].rolled_back = true;
      break;
    default:
      break;
  }
}

absl::Status BackupStream::EndOfStream() {
  if (!finished_) {
    finished_ = true;
    final_status_ = StatusOfCall(stream_->Finish(), context_, "BackupSession");
  }
  if (!final_status_.ok()) return final_status_;
  return absl::OutOfRangeError("BackupSession: the stream ended");
}

absl::Status BackupStream::ReadWire(v1::BackupServerMessage* message) {
  if (ended_ || !stream_->Read(message)) {
    ended_ = true;
    return EndOfStream();
  }
  Apply(*message);
  return absl::OkStatus();
}

absl::Status BackupStream::SendPrepare(
    const std::vector<v1::BackupSpec>& specs) {
  v1::BackupClientMessage message;
  message.mutable_prepare()->mutable_specs()->Add(specs.begin(), specs.end());
  return Write(message);
}

absl::StatusOr<std::vector<uint64_t>> BackupStream::Prepare(
    const std::vector<v1::BackupSpec>& specs) {
  if (absl::Status s = SendPrepare(specs); !s.ok()) return s;
  v1::BackupServerMessage message;
  while (true) {
    if (absl::Status s = ReadWire(&message); !s.ok()) return s;
    if (message.has_prepared()) {
      return std::vector<uint64_t>(message.prepared().backup_ids().begin(),
                                   message.prepared().backup_ids().end());
    }
    if (message.has_error()) {
      return absl::Status(
          static_cast<absl::StatusCode>(message.error().code()),
          absl::StrCat("BackupSession prepare: ", message.error().message()));
    }
    buffered_.push_back(std::move(message));
  }
}

absl::Status BackupStream::LayerStored(
    const std::vector<uint64_t>& backup_ids, uint32_t step,
    const std::vector<v1::RankFence>& fences) {
  v1::BackupClientMessage message;
  v1::BackupClientMessage::LayerStored* stored = message.mutable_layer_stored();
  stored->mutable_backup_ids()->Add(backup_ids.begin(), backup_ids.end());
  stored->set_step(step);
  stored->mutable_fences()->Add(fences.begin(), fences.end());
  return Write(message);
}

absl::Status BackupStream::StoreAll(uint64_t backup_id) {
  v1::BackupClientMessage message;
  message.mutable_store_all()->set_backup_id(backup_id);
  return Write(message);
}

absl::Status BackupStream::Rollback(uint64_t backup_id) {
  v1::BackupClientMessage message;
  message.mutable_rollback()->set_backup_id(backup_id);
  return Write(message);
}

absl::StatusOr<v1::BackupServerMessage> BackupStream::Next() {
  if (!buffered_.empty()) {
    v1::BackupServerMessage message = std::move(buffered_.front());
    buffered_.pop_front();
    return message;
  }
  v1::BackupServerMessage message;
  if (absl::Status s = ReadWire(&message); !s.ok()) return s;
  return message;
}

// Reads (keeping what it reads) until `done` holds for the progress.
absl::Status BackupStream::WaitFor(
    uint64_t backup_id, absl::FunctionRef<bool(const BackupProgress&)> done) {
  while (!done(Progress(backup_id))) {
    v1::BackupServerMessage message;
    if (absl::Status s = ReadWire(&message); !s.ok()) return s;
    if (message.has_error()) {
      absl::MutexLock lock(&state_mu_);
      errors_.push_back(message.error());
    } else {
      buffered_.push_back(std::move(message));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> BackupStream::WaitCommitted(uint64_t backup_id) {
  if (absl::Status s =
          WaitFor(backup_id, [](const BackupProgress& p) { return p.ended(); });
      !s.ok()) {
    return s;
  }
  const BackupProgress progress = Progress(backup_id);
  if (progress.rolled_back) {
    return absl::AbortedError(
        absl::StrCat("backup ", backup_id, " was rolled back"));
  }
  return progress.node;
}

absl::Status BackupStream::WaitSteps(uint64_t backup_id, int steps_done) {
  return WaitFor(backup_id, [steps_done](const BackupProgress& p) {
    return p.ended() || p.steps_done >= steps_done;
  });
}

BackupProgress BackupStream::Progress(uint64_t backup_id) const {
  absl::MutexLock lock(&state_mu_);
  auto it = progress_.find(backup_id);
  return it == progress_.end() ? BackupProgress() : it->second;
}

void BackupStream::ForgetEnded() {
  absl::MutexLock lock(&state_mu_);
  std::erase_if(progress_,
                [](const auto& entry) { return entry.second.ended(); });
}

std::vector<v1::BackupServerMessage::Error> BackupStream::TakeErrors() {
  absl::MutexLock lock(&state_mu_);
  return std::exchange(errors_, {});
}

void BackupStream::ClearBuffered() { buffered_.clear(); }

absl::Status BackupStream::Close() {
  if (finished_) return final_status_;
  {
    absl::MutexLock lock(&write_mu_);
    if (!writes_done_) {
      writes_done_ = true;
      stream_->WritesDone();
    }
  }
  v1::BackupServerMessage message;
  while (!ended_ && stream_->Read(&message)) {
    Apply(message);
    if (message.has_error()) {
      absl::MutexLock lock(&state_mu_);
      errors_.push_back(message.error());
    } else {
      buffered_.push_back(std::move(message));
    }
  }
  ended_ = true;
  (void)EndOfStream();
  return final_status_;
}

}  // namespace hicache::client
