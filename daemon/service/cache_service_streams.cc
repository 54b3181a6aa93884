// The streaming cache RPCs: LoadBack and BackupSession. Each stream's events
// arrive in an EventMailbox (no polling); see cache_service.h for the
// contract and docs/api.md for the semantics.
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/core/mutex.h"
#include "daemon/engine/event_mailbox.h"
#include "daemon/service/cache_service.h"
#include "daemon/service/proto_convert.h"
#include "daemon/service/rpc_util.h"

namespace hicache::service {

grpc::Status CacheRpcs::LoadBack(
    grpc::ServerContext* context, const v1::LoadBackRequest& request,
    grpc::ServerWriter<v1::LoadBackEvent>* writer) {
  if (!request.tokens().empty() && request.items_size() > 0) {
    return Invalid("give tokens (one request) or items (a batch), not both");
  }
  const SessionLimits& limits = sessions_->limits();
  if (request.items_size() > limits.max_items_per_request) {
    return Invalid(absl::StrCat("items has ", request.items_size(),
                                " entries; the limit is ",
                                limits.max_items_per_request));
  }
  std::vector<std::vector<int32_t>> items;
  std::vector<int64_t> extends;
  int64_t total_tokens = 0;
  for (int i = 0; i < std::max(1, request.items_size()); ++i) {
    const std::string& bytes =
        request.items_size() > 0 ? request.items(i).tokens() : request.tokens();
    const int64_t extend = request.items_size() > 0
                               ? request.items(i).extend_tokens()
                               : request.extend_tokens();
    if (extend < 0 || extend > limits.max_tokens_per_request) {
      return Invalid(absl::StrCat("extend_tokens must be in [0, ",
                                  limits.max_tokens_per_request, "], got ",
                                  extend));
    }
    extends.push_back(extend);
    auto tokens = DecodeTokens(bytes, request.items_size() > 0
                                          ? absl::StrCat("items[", i, "].tokens")
                                          : std::string("tokens"));
    if (!tokens.ok()) return ToGrpcStatus(tokens.status());
    total_tokens += static_cast<int64_t>(tokens->size());
    items.push_back(*std::move(tokens));
  }
  if (total_tokens > limits.max_tokens_per_request) {
    return Invalid(absl::StrCat("the call carries ", total_tokens,
                                " tokens; the limit is ",
                                limits.max_tokens_per_request,
                                " (--max_tokens_per_request)"));
  }
  const std::string& session = request.session_id();
  if (absl::Status s = sessions_->BeginStream(session); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<SessionInfo> info = sessions_->Info(session);
  // Events arrive in the mailbox as the copies complete; a reader too slow
  // for the backlog is cut off (its loads are finished as failed below).
  auto box = std::make_shared<EventMailbox>(
      limits_.max_backlog, [context] { context->TryCancel(); });
  struct Pending {
    uint32_t item;
    NodeId node;
  };
  std::map<uint64_t, Pending> pending;  // Loads in flight, by op id.
  absl::Status failed;
  for (size_t i = 0; i < items.size(); ++i) {
    // Page-floored, as Admit: the request writes whole pages only.
    auto load = sessions_->LoadBack(
        session, items[i],
        {.extend_tokens = extends[i], .exact_tail = false});
    if (!load.ok()) {
      failed = load.status();  // Items already started still finish below.
      break;
    }
    v1::LoadBackEvent started;
    v1::LoadBackEvent::Started* s = started.mutable_started();
    s->set_load_id(load->op_id);
    ToProto(load->pages, load->device_len + load->loaded_len,
            s->mutable_locations());
    s->set_device_tokens(load->device_len);
    s->set_loaded_tokens(load->loaded_len);
    s->set_num_steps(load->num_steps);
    s->set_node(load->node);
    s->set_miss_reason(std::string(LoadMissReasonName(load->miss)));
    s->set_lock_handle(load->lock_handle);
    s->set_item(static_cast<uint32_t>(i));
    writer->Write(started);
    if (load->op_id == 0) {
      // Nothing to load: the item still ends with its terminal event (the
      // device hit, if any, is already locked for the session).
      v1::LoadBackEvent done;
      done.mutable_done()->set_ok(true);
      done.mutable_done()->set_item(static_cast<uint32_t>(i));
      writer->Write(done);
      continue;
    }
    if (info.ok()) hub_->Tag(load->op_id, info->ns);  // Its workers hear too.
    hub_->Claim(load->op_id, box);
    pending[load->op_id] = Pending{static_cast<uint32_t>(i), load->node};
  }
  while (!pending.empty() && !context->IsCancelled()) {
    // The wake-up bound only notices a client that went away mid-load; the
    // copies themselves signal the mailbox.
    std::optional<OpEvent> event = box->Wait(absl::Now() + absl::Seconds(1));
    if (!event.has_value()) {
      if (box->overflowed()) break;
      continue;
    }
    auto it = pending.find(event->op);
    if (it == pending.end()) continue;
    if (event->type == OpEvent::Type::kLoadStep) {
      v1::LoadBackEvent layer;
      layer.mutable_layer_loaded()->set_rank(event->rank);
      layer.mutable_layer_loaded()->set_step(event->step);
      layer.mutable_layer_loaded()->set_fence(event->fence);
      layer.mutable_layer_loaded()->set_load_id(event->op);
      writer->Write(layer);
      continue;
    }
    if (event->type != OpEvent::Type::kLoadDone) continue;
    bool ok = event->ok;
    hub_->Forget(event->op);
    // Hand the load's lock over to an ordinary session lock on the node
    // (taken before the load's own lock is released, so the node is never
    // unlocked in between).
    uint64_t lock_handle = 0;
    if (ok) {
      absl::StatusOr<std::vector<uint64_t>> handles =
          sessions_->Lock(session, {it->second.node});
      if (handles.ok()) {
        lock_handle = handles->front();
      } else {
        ok = false;  // Never report a hit the session does not hold.
      }
    }
    (void)sessions_->FinishLoad(session, event->op);
    v1::LoadBackEvent done;
    done.mutable_done()->set_ok(ok);
    done.mutable_done()->set_lock_handle(lock_handle);
    done.mutable_done()->set_load_id(event->op);
    done.mutable_done()->set_item(it->second.item);
    writer->Write(done);
    pending.erase(it);
  }
  // A client that went away, or read too slowly: its loads are abandoned.
  for (const auto& [op, unused] : pending) {
    hub_->Forget(op);
    (void)sessions_->FinishLoad(session, op);
  }
  box->Disarm();  // `context` dies with this call.
  sessions_->EndStream(session);
  if (box->overflowed()) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "load-back stream cut off: the client read too slowly");
  }
  if (!failed.ok()) return ToGrpcStatus(failed);
  return grpc::Status::OK;
}

namespace {

// A worker's view of an engine event.
v1::WorkerEvent ToWorkerEvent(const OpEvent& event) {
  v1::WorkerEvent out;
  out.set_rank(event.rank);
  switch (event.type) {
    case OpEvent::Type::kBackupStep:
      out.mutable_backup_step()->set_backup_id(event.op);
      out.mutable_backup_step()->set_step(event.step);
      break;
    case OpEvent::Type::kCommitted:
    case OpEvent::Type::kRolledBack:
      out.mutable_backup_ended()->set_backup_id(event.op);
      out.mutable_backup_ended()->set_committed(event.type ==
                                                OpEvent::Type::kCommitted);
      break;
    case OpEvent::Type::kLoadStep:
      out.mutable_layer_loaded()->set_load_id(event.op);
      out.mutable_layer_loaded()->set_step(event.step);
      out.mutable_layer_loaded()->set_fence(event.fence);
      break;
    case OpEvent::Type::kLoadDone:
      out.mutable_load_ended()->set_load_id(event.op);
      out.mutable_load_ended()->set_ok(event.ok);
      break;
  }
  return out;
}

}  // namespace

grpc::Status CacheRpcs::Subscribe(grpc::ServerContext* context,
                                  const v1::SubscribeRequest& request,
                                  grpc::ServerWriter<v1::WorkerEvent>* writer) {
  const std::string& session = request.session_id();
  absl::StatusOr<SessionInfo> info = sessions_->Info(session);
  if (!info.ok()) return ToGrpcStatus(info.status());
  if (info->role != SessionRole::kWorker) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "Subscribe needs a worker session (its rank's events)");
  }
  if (absl::Status s = sessions_->BeginStream(session); !s.ok()) {
    return ToGrpcStatus(s);
  }
  auto box = std::make_shared<EventMailbox>(
      limits_.max_backlog, [context] { context->TryCancel(); });
  const uint64_t subscription = hub_->Subscribe(info->rank, info->ns, box);
  v1::WorkerEvent live;
  live.set_rank(info->rank);
  live.mutable_subscribed();
  writer->Write(live);
  while (!context->IsCancelled()) {
    // The bound only notices a client that went away or a session that
    // ended; events wake the mailbox at once.
    std::optional<OpEvent> event = box->Wait(absl::Now() + absl::Seconds(1));
    if (!event.has_value()) {
      if (box->overflowed() || !sessions_->Info(session).ok()) break;
      continue;
    }
    if (event->type != OpEvent::Type::kBackupStep &&
        event->type != OpEvent::Type::kLoadStep) {
      event->rank = info->rank;  // Outcomes are the op's, stamped for us.
    }
    if (!writer->Write(ToWorkerEvent(*event))) break;
  }
  hub_->Unsubscribe(subscription);
  box->Disarm();
  sessions_->EndStream(session);
  if (box->overflowed()) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "subscription cut off: the client read too slowly");
  }
  return grpc::Status::OK;
}

namespace {

// The server message for an engine event of a backup, or nullopt.
std::optional<v1::BackupServerMessage> ToBackupMessage(const OpEvent& event) {
  v1::BackupServerMessage out;
  switch (event.type) {
    case OpEvent::Type::kBackupStep:
      out.mutable_step_done()->set_backup_id(event.op);
      out.mutable_step_done()->set_rank(event.rank);
      out.mutable_step_done()->set_step(event.step);
      return out;
    case OpEvent::Type::kCommitted:
      out.mutable_committed()->set_backup_id(event.op);
      out.mutable_committed()->set_node(event.node);
      return out;
    case OpEvent::Type::kRolledBack:
      out.mutable_rolled_back()->set_backup_id(event.op);
      return out;
    default:
      return std::nullopt;
  }
}

}  // namespace

grpc::Status CacheRpcs::BackupSession(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::BackupServerMessage, v1::BackupClientMessage>*
        stream) {
  v1::BackupClientMessage in;
  if (!stream->Read(&in)) return grpc::Status::OK;  // Closed before a word.
  const std::string session = in.session_id();
  if (session.empty()) {
    return Invalid(
        "every BackupSession message must carry the stream's session_id");
  }
  if (absl::Status s = sessions_->BeginStream(session); !s.ok()) {
    return ToGrpcStatus(s);
  }
  // Two threads: this one reads client messages; `events` writes the
  // per-layer progress and outcomes of this stream's backups, blocking on the
  // mailbox (an idle stream costs no CPU). A client too slow for the backlog
  // is cut off: the mailbox cancels the RPC and its backups roll back.
  auto box = std::make_shared<EventMailbox>(
      limits_.max_backlog, [context] { context->TryCancel(); });
  Mutex mu;  // The stream's state; never held while writing.
  std::set<uint64_t> open_backups;  // GUARDED_BY(mu)
  std::set<uint64_t> claimed;       // GUARDED_BY(mu)
  bool reading = true;              // GUARDED_BY(mu)
  Mutex write_mu;  // One writer at a time (gRPC's rule); may block long.
  auto write = [&](const v1::BackupServerMessage& message) {
    MutexLock lock(&write_mu);
    stream->Write(message);
  };
  std::thread events([&] {
    while (true) {
      std::optional<OpEvent> event = box->Wait(absl::InfiniteFuture());
      if (!event.has_value()) return;  // Closed or overflowed.
      std::optional<v1::BackupServerMessage> out = ToBackupMessage(*event);
      if (!out.has_value()) continue;
      bool last = false;
      if (event->type != OpEvent::Type::kBackupStep) {
        sessions_->BackupFinished(session, event->op);
        MutexLock lock(&mu);
        open_backups.erase(event->op);
        last = !reading && open_backups.empty();
      }
      write(*out);
      if (last) return;
    }
  });
  grpc::Status result = grpc::Status::OK;
  do {
    if (!in.session_id().empty() && in.session_id() != session) {
      result = Invalid(
          "every BackupSession message must carry the stream's session_id");
      break;
    }
    absl::Status status;
    if (in.has_prepare()) {
      std::vector<BackupSpec> specs;
      for (const v1::BackupSpec& spec : in.prepare().specs()) {
        specs.push_back(
            {std::vector<LogicalPage>(spec.pages().begin(), spec.pages().end()),
             spec.logical_tokens()});
      }
      auto ids = sessions_->PrepareBackups(session, specs);
      status = ids.status();
      if (ids.ok()) {
        v1::BackupServerMessage out;
        out.mutable_prepared()->mutable_backup_ids()->Add(ids->begin(),
                                                          ids->end());
        {
          MutexLock lock(&mu);
          for (uint64_t id : *ids) {
            if (id == 0) continue;
            open_backups.insert(id);
            claimed.insert(id);
          }
        }
        // Tagged for the namespace's workers and claimed before the client
        // can store a layer: no event is missed.
        absl::StatusOr<SessionInfo> info = sessions_->Info(session);
        for (uint64_t id : *ids) {
          if (id == 0) continue;
          if (info.ok()) hub_->Tag(id, info->ns);
          hub_->Claim(id, box);
        }
        write(out);
      }
    } else if (in.has_layer_stored()) {
      std::vector<uint64_t> ids(in.layer_stored().backup_ids().begin(),
                                in.layer_stored().backup_ids().end());
      std::vector<RankFence> fences;
      for (const v1::RankFence& fence : in.layer_stored().fences()) {
        fences.push_back({fence.rank(), fence.fence_id()});
      }
      status = sessions_->LayerStored(session, ids, in.layer_stored().step(),
                                      fences);
    } else if (in.has_store_all()) {
      status = sessions_->StoreAll(session, in.store_all().backup_id());
    } else if (in.has_rollback()) {
      status = sessions_->Rollback(session, in.rollback().backup_id());
    } else {
      status = absl::InvalidArgumentError("empty BackupClientMessage");
    }
    if (!status.ok()) {
      v1::BackupServerMessage error;
      error.mutable_error()->set_code(static_cast<int>(status.code()));
      error.mutable_error()->set_message(std::string(status.message()));
      write(error);
    }
  } while (stream->Read(&in));
  // The client is done: it half-closed, broke the stream, or sent a bad
  // message. Backups that still need it (a layer not stored, no node
  // attached) can never complete: roll them back now. On a half-close the
  // rest only wait for copies, so their outcomes are still delivered.
  const bool broken = context->IsCancelled() || !result.ok();
  std::vector<uint64_t> doomed;
  {
    MutexLock lock(&mu);
    reading = false;
    for (uint64_t id : open_backups) {
      absl::StatusOr<bool> waits = engine_->BackupAwaitsClient(id);
      if (broken || (waits.ok() && *waits)) doomed.push_back(id);
    }
  }
  for (uint64_t id : doomed) (void)sessions_->Rollback(session, id);
  {
    MutexLock lock(&mu);
    if (open_backups.empty()) box->Close();
  }
  events.join();
  {
    MutexLock lock(&mu);
    for (uint64_t id : claimed) hub_->Forget(id);
  }
  box->Disarm();  // `context` dies with this call.
  sessions_->EndStream(session);
  if (box->overflowed()) {
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("backup stream cut off: more than ", limits_.max_backlog,
                     " events waited for a client that read too slowly; its "
                     "backups were rolled back"));
  }
  return result;
}

}  // namespace hicache::service
