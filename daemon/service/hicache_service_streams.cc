// HiCacheService: the streaming RPCs. What a stream owns and what happens
// when its client goes away live in the engine layer (BackupStream,
// LoadStream, WorkerSubscription); these handlers convert and write.
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/core/mutex.h"
#include "daemon/engine/backup_stream.h"
#include "daemon/engine/load_stream.h"
#include "daemon/engine/worker_subscription.h"
#include "daemon/service/hicache_service.h"
#include "daemon/service/proto_convert.h"
#include "daemon/service/rpc_util.h"

namespace hicache::service {

grpc::Status HiCacheService::LoadBack(
    grpc::ServerContext* context, const v1::LoadBackRequest* request_in,
    grpc::ServerWriter<v1::LoadBackEvent>* writer) {
  if (grpc::Status s = guard_.Check(context, "LoadBack"); !s.ok()) return s;
  const v1::LoadBackRequest& request = *request_in;
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
  if (grpc::Status s = CheckSessionCaller(context, request.session_id());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<LoadStream>> stream =
      LoadStream::Open(StreamContextFor(context), request.session_id());
  if (!stream.ok()) return ToGrpcStatus(stream.status());
  absl::Status failed;
  for (size_t i = 0; i < items.size(); ++i) {
    // Page-floored, as Admit: the request writes whole pages only.
    auto load = (*stream)->Start(
        static_cast<uint32_t>(i), items[i],
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
    }
  }
  while ((*stream)->pending() && !context->IsCancelled()) {
    // The wake-up bound only notices a client that went away mid-load; the
    // copies themselves signal the stream.
    std::optional<LoadStream::Event> event =
        (*stream)->Next(absl::Now() + absl::Seconds(1));
    if (!event.has_value()) {
      if ((*stream)->overflowed()) break;
      continue;
    }
    v1::LoadBackEvent out;
    if (event->kind == LoadStream::Event::Kind::kLayer) {
      v1::LoadBackEvent::LayerLoaded* layer = out.mutable_layer_loaded();
      layer->set_rank(event->rank);
      layer->set_step(event->step);
      layer->set_fence(event->fence);
      layer->set_load_id(event->load);
    } else {
      v1::LoadBackEvent::Done* done = out.mutable_done();
      done->set_ok(event->ok);
      done->set_lock_handle(event->lock_handle);
      done->set_load_id(event->load);
      done->set_item(event->item);
    }
    writer->Write(out);
  }
  const bool overflowed = (*stream)->overflowed();
  stream->reset();  // Abandons what is still running; the stream ends.
  if (overflowed) {
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

grpc::Status HiCacheService::Subscribe(
    grpc::ServerContext* context, const v1::SubscribeRequest* request,
    grpc::ServerWriter<v1::WorkerEvent>* writer) {
  if (grpc::Status s = CheckSessionCaller(context, request->session_id());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<WorkerSubscription>> subscription =
      WorkerSubscription::Open(StreamContextFor(context),
                               request->session_id());
  if (!subscription.ok()) return ToGrpcStatus(subscription.status());
  v1::WorkerEvent live;
  live.set_rank((*subscription)->rank());
  live.mutable_subscribed();
  writer->Write(live);
  while (!context->IsCancelled() && !(*subscription)->ended()) {
    // The bound only notices a client that went away or a session that
    // ended; events wake the stream at once.
    std::optional<OpEvent> event =
        (*subscription)->Next(absl::Now() + absl::Seconds(1));
    if (!event.has_value()) continue;
    if (!writer->Write(ToWorkerEvent(*event))) break;
  }
  const bool overflowed = (*subscription)->overflowed();
  subscription->reset();
  if (overflowed) {
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

grpc::Status HiCacheService::BackupSession(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::BackupServerMessage, v1::BackupClientMessage>*
        stream) {
  v1::BackupClientMessage in;
  if (!stream->Read(&in)) return grpc::Status::OK;  // Closed before a word.
  if (in.session_id().empty()) {
    return Invalid(
        "every BackupSession message must carry the stream's session_id");
  }
  // A scheduler's message (prepare, store_all, rollback) needs the leader;
  // a worker's layer_stored is served here (rpc_scope.h).
  auto scheduler_message = [](const v1::BackupClientMessage& message) {
    return message.has_prepare() || message.has_store_all() ||
           message.has_rollback();
  };
  if (scheduler_message(in)) {
    if (grpc::Status s = guard_.Check(context, "BackupSession"); !s.ok()) {
      return s;
    }
  }
  if (grpc::Status s = CheckSessionCaller(context, in.session_id());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<BackupStream>> backups =
      BackupStream::Open(StreamContextFor(context), in.session_id());
  if (!backups.ok()) return ToGrpcStatus(backups.status());
  BackupStream& state = **backups;
  // Two threads: this one reads client messages; `events` writes the
  // per-layer progress and outcomes of this stream's backups, blocking in
  // NextEvent (an idle stream costs no CPU).
  Mutex write_mu;  // One writer at a time (gRPC's rule); may block long.
  auto write = [&](const v1::BackupServerMessage& message) {
    MutexLock lock(&write_mu);
    stream->Write(message);
  };
  std::thread events([&] {
    while (std::optional<OpEvent> event = state.NextEvent()) {
      if (std::optional<v1::BackupServerMessage> out = ToBackupMessage(*event)) {
        write(*out);
      }
    }
  });
  grpc::Status result = grpc::Status::OK;
  do {
    if (!in.session_id().empty() && in.session_id() != state.session()) {
      result = Invalid(
          "every BackupSession message must carry the stream's session_id");
      break;
    }
    if (scheduler_message(in)) {
      if (grpc::Status s = guard_.Check(context, "BackupSession"); !s.ok()) {
        result = s;
        break;
      }
    }
    absl::Status status;
    if (in.has_prepare()) {
      std::vector<BackupSpec> specs;
      for (const v1::BackupSpec& spec : in.prepare().specs()) {
        specs.push_back(
            {std::vector<LogicalPage>(spec.pages().begin(), spec.pages().end()),
             spec.logical_tokens()});
      }
      auto ids = state.Prepare(specs);
      status = ids.status();
      if (ids.ok()) {
        v1::BackupServerMessage out;
        out.mutable_prepared()->mutable_backup_ids()->Add(ids->begin(),
                                                          ids->end());
        write(out);
      }
    } else if (in.has_layer_stored()) {
      std::vector<uint64_t> ids(in.layer_stored().backup_ids().begin(),
                                in.layer_stored().backup_ids().end());
      std::vector<RankFence> fences;
      for (const v1::RankFence& fence : in.layer_stored().fences()) {
        fences.push_back({fence.rank(), fence.fence_id()});
      }
      if (group_ != nullptr && !group_->IsLeader()) {
        // A CP group follower: the leader runs the backups; a local worker's
        // ack is relayed to it (docs/cp-groups.md, "Worker events and acks
        // across the link") with the session's namespace and rank.
        absl::StatusOr<SessionInfo> info = sessions_->Info(state.session());
        if (!info.ok()) {
          status = info.status();
        } else if (info->role != SessionRole::kWorker) {
          status = absl::FailedPreconditionError(absl::StrCat(
              "a scheduler's layer_stored goes to the CP group leader at ",
              group_->LeaderAddress()));
        } else if (!fences.empty()) {
          status = absl::FailedPreconditionError(
              "fences on a CP group follower are not supported yet");
        } else {
          status = group_->ForwardLayerStored(
              info->ns, info->rank, in.layer_stored().step(), ids, fences);
        }
      } else {
        status = state.LayerStored(ids, in.layer_stored().step(), fences);
      }
    } else if (in.has_store_all()) {
      status = state.StoreAll(in.store_all().backup_id());
    } else if (in.has_rollback()) {
      status = state.Rollback(in.rollback().backup_id());
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
  // message. On a half-close the outcomes of backups that only wait for
  // copies are still delivered.
  state.EndOfInput(/*broken=*/context->IsCancelled() || !result.ok());
  events.join();
  const bool overflowed = state.overflowed();
  backups->reset();
  if (overflowed) {
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("backup stream cut off: more than ", limits_.max_backlog,
                     " events waited for a client that read too slowly; its "
                     "backups were rolled back"));
  }
  return result;
}

}  // namespace hicache::service
