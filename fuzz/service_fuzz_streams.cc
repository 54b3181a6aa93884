// The streaming RPCs' server sides in //fuzz:service_fuzzer (Run,
// service_fuzz_run.h): what HiCacheService's BackupSession, LoadBack and
// Subscribe handlers run, on the fuzzer's thread, at fixed points of the
// input. StartLoadBack repeats the LoadBack handler's request checks; keep
// it in step with daemon/service/hicache_service_streams.cc.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/engine/backup_stream.h"
#include "daemon/engine/load_stream.h"
#include "daemon/engine/session_manager.h"
#include "daemon/engine/worker_subscription.h"
#include "fuzz/service_fuzz_report.h"
#include "fuzz/service_fuzz_run.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::fuzz {

// One client message on `rpc` (a new RPC when none runs), as the handler's
// reader does with it. Returns the status the server streams as `error`
// (or ends the RPC with); `prepared` receives a prepare's ids. *ended is
// set when the server ends the RPC after this message.
absl::Status Run::BackupMessage(BackupRpc& rpc,
                                const v1::BackupClientMessage& in,
                                size_t backlog, std::vector<uint64_t>* prepared,
                                bool* ended) {
  *ended = false;
  if (rpc.stream == nullptr) {
    // The first message names the session and opens the stream.
    rpc = BackupRpc();
    if (in.session_id().empty()) {
      *ended = true;
      return absl::InvalidArgumentError(
          "every BackupSession message must carry the stream's session_id");
    }
    rpc.cancelled = std::make_shared<std::atomic<bool>>(false);
    absl::StatusOr<std::unique_ptr<BackupStream>> opened = BackupStream::Open(
        service_->Context(backlog, rpc.cancelled), in.session_id());
    if (!opened.ok()) {
      *ended = true;
      return opened.status();
    }
    rpc.stream = *std::move(opened);
    rpc.session = in.session_id();
    Trace("    BackupSession of '", rpc.session, "' opened (backlog ", backlog,
          ")");
  } else if (!in.session_id().empty() && in.session_id() != rpc.session) {
    *ended = true;
    EndBackup(rpc, /*broken=*/true);
    return absl::InvalidArgumentError(
        "every BackupSession message must carry the stream's session_id");
  }
  BackupStream& state = *rpc.stream;
  if (in.has_prepare()) {
    std::vector<BackupSpec> specs;
    for (const v1::BackupSpec& spec : in.prepare().specs()) {
      Trace("    prepare: pages [", absl::StrJoin(spec.pages(), ","), "], ",
            spec.logical_tokens(), " tokens");
      specs.push_back(
          {std::vector<LogicalPage>(spec.pages().begin(), spec.pages().end()),
           spec.logical_tokens()});
    }
    absl::StatusOr<std::vector<uint64_t>> ids = state.Prepare(specs);
    if (!ids.ok()) return ids.status();
    const auto ns = session_ns_.find(rpc.session);
    for (uint64_t id : *ids) {
      if (id == 0) continue;
      rpc.prepared.insert(id);
      rpc.open.insert(id);
      if (ns != session_ns_.end()) op_ns_[id] = ns->second;
    }
    if (prepared != nullptr) *prepared = *std::move(ids);
    return absl::OkStatus();
  }
  if (in.has_layer_stored()) {
    std::vector<uint64_t> ids(in.layer_stored().backup_ids().begin(),
                              in.layer_stored().backup_ids().end());
    std::vector<RankFence> fences;
    for (const v1::RankFence& fence : in.layer_stored().fences()) {
      fences.push_back({fence.rank(), fence.fence_id()});
    }
    return state.LayerStored(ids, in.layer_stored().step(), fences);
  }
  if (in.has_store_all()) return state.StoreAll(in.store_all().backup_id());
  if (in.has_rollback()) return state.Rollback(in.rollback().backup_id());
  return absl::InvalidArgumentError("empty BackupClientMessage");
}

// The RPC's writer thread, as far as it can run without blocking: every
// event that has reached the mailbox, and the end once there is one.
void Run::PumpBackup(BackupRpc& rpc) {
  if (rpc.stream == nullptr || rpc.writer_done) return;
  while (true) {
    // NextEvent returns at once when an event is there (or being
    // delivered), and when the stream is over: input ended and every
    // outcome taken (or the mailbox overflowed: nothing is left then).
    const bool over = rpc.input_ended && rpc.open.empty();
    if (!over && rpc.taken >= counter_.Events(rpc.prepared) &&
        !rpc.cancelled->load()) {
      return;  // NextEvent would block.
    }
    std::optional<OpEvent> event = rpc.stream->NextEvent();
    if (!event.has_value()) {
      rpc.writer_done = true;
      Trace("    BackupSession of '", rpc.session, "': events end",
            rpc.stream->overflowed() ? " (overflowed)" : "");
      return;
    }
    ++rpc.taken;
    if (!rpc.prepared.contains(event->op)) {
      Fail(absl::StrCat("BackupSession of ", rpc.session,
                        " streamed an event of operation ", event->op,
                        ", which it never prepared"),
           engine_.get());
    }
    if (event->type == OpEvent::Type::kCommitted ||
        event->type == OpEvent::Type::kRolledBack) {
      Trace("    backup ", event->op,
            event->type == OpEvent::Type::kCommitted ? " committed"
                                                     : " rolled back",
            " (stream of '", rpc.session, "')");
      rpc.open.erase(event->op);
      if (event->type == OpEvent::Type::kCommitted) {
        Remember(nodes_, event->node);
      }
    }
  }
}

// The client is done with `rpc`: it half-closed (`broken` false) or the
// RPC broke. As the handler: EndOfInput, then the writer runs until its
// events end; the RPC is destroyed. An outcome that does not arrive within
// kHung of every copy completing means the RPC would never end.
void Run::EndBackup(BackupRpc& rpc, bool broken) {
  if (rpc.stream == nullptr) {
    rpc = BackupRpc();
    return;
  }
  if (!rpc.input_ended) {
    Trace("    ending the BackupSession of '", rpc.session, "' with ",
          rpc.open.size(), " backups open", broken ? ", broken" : "");
    rpc.stream->EndOfInput(broken);
    rpc.input_ended = true;
  }
  PumpBackup(rpc);
  if (!rpc.writer_done) {
    Settle();
    const absl::Time deadline = absl::Now() + kHung;
    while (true) {
      PumpBackup(rpc);
      if (rpc.writer_done) break;
      if (!counter_.AwaitMore(rpc.prepared, rpc.taken, deadline)) {
        Fail(absl::StrCat("BackupSession of ", rpc.session,
                          " never streamed the outcome of backups ",
                          absl::StrJoin(rpc.open, ","), " within ",
                          absl::FormatDuration(kHung),
                          " after every copy completed"),
             engine_.get());
      }
    }
  }
  rpc.stream.reset();
  rpc = BackupRpc();
}

// As HiCacheService::LoadBack up to its loop: the request's checks, the
// stream, each item's Start (an item that fails ends the starts; those
// started still run). Returns the RPC while a load is pending (else null:
// the RPC is over) and, in *failed, the status the RPC ends with.
std::unique_ptr<LoadRpc> Run::StartLoadBack(const v1::LoadBackRequest& request,
                                            size_t backlog,
                                            absl::Status* failed,
                                            std::vector<LoadResult>* started) {
  *failed = absl::OkStatus();
  const SessionLimits& limits = sessions_->limits();
  if (!request.tokens().empty() && request.items_size() > 0) {
    *failed = absl::InvalidArgumentError(
        "give tokens (one request) or items (a batch), not both");
    return nullptr;
  }
  if (request.items_size() > limits.max_items_per_request) {
    *failed = absl::InvalidArgumentError("too many items");
    return nullptr;
  }
  std::vector<std::vector<int32_t>> items;
  std::vector<int64_t> extends;
  int64_t total = 0;
  for (int i = 0; i < std::max(1, request.items_size()); ++i) {
    const std::string& bytes =
        request.items_size() > 0 ? request.items(i).tokens() : request.tokens();
    const int64_t extend = request.items_size() > 0
                               ? request.items(i).extend_tokens()
                               : request.extend_tokens();
    if (extend < 0 || extend > limits.max_tokens_per_request) {
      *failed = absl::InvalidArgumentError(
          absl::StrCat("extend_tokens out of range: ", extend));
      return nullptr;
    }
    if (bytes.size() % 4 != 0) {
      *failed = absl::InvalidArgumentError("tokens: not a multiple of 4");
      return nullptr;
    }
    std::vector<int32_t> tokens(bytes.size() / 4);
    if (!bytes.empty()) std::memcpy(tokens.data(), bytes.data(), bytes.size());
    total += static_cast<int64_t>(tokens.size());
    items.push_back(std::move(tokens));
    extends.push_back(extend);
  }
  if (total > limits.max_tokens_per_request) {
    *failed = absl::InvalidArgumentError("too many tokens");
    return nullptr;
  }
  auto rpc = std::make_unique<LoadRpc>();
  rpc->session = request.session_id();
  rpc->cancelled = std::make_shared<std::atomic<bool>>(false);
  absl::StatusOr<std::unique_ptr<LoadStream>> stream = LoadStream::Open(
      service_->Context(backlog, rpc->cancelled), request.session_id());
  if (!stream.ok()) {
    *failed = stream.status();
    return nullptr;
  }
  rpc->stream = *std::move(stream);
  const auto ns = session_ns_.find(rpc->session);
  for (size_t i = 0; i < items.size(); ++i) {
    absl::StatusOr<LoadResult> load =
        rpc->stream->Start(static_cast<uint32_t>(i), items[i],
                           {.extend_tokens = extends[i], .exact_tail = false});
    if (!load.ok()) {
      *failed = load.status();
      break;
    }
    Trace("    item ", i, ": load ", load->op_id, " node ", load->node,
          " miss ", LoadMissReasonName(load->miss), " device ",
          load->device_len, " loaded ", load->loaded_len, " handle ",
          load->lock_handle);
    for (LogicalPage p : load->pages) Remember(pages_, p);
    if (load->node != kNoNode) Remember(nodes_, load->node);
    AddHandle(rpc->session, load->lock_handle);
    if (load->op_id != 0) {
      rpc->loads.insert(load->op_id);
      Remember(load_ids_, load->op_id);
      if (ns != session_ns_.end()) op_ns_[load->op_id] = ns->second;
    }
    if (started != nullptr) started->push_back(*load);
  }
  if (!rpc->stream->pending()) return nullptr;  // Nothing to wait for.
  return rpc;
}

void Run::TakeLoadEvent(LoadRpc& rpc, const LoadStream::Event& event) {
  if (!rpc.loads.contains(event.load)) {
    Fail(
        absl::StrCat("LoadBack of ", rpc.session, " streamed an event of load ",
                     event.load, ", which it never started"),
        engine_.get());
  }
  if (event.kind != LoadStream::Event::Kind::kDone) return;
  Trace("    load ", event.load, " done ok=", event.ok, " handle ",
        event.lock_handle);
  if (event.ok && event.lock_handle == 0) {
    Fail(
        absl::StrCat("load ", event.load, " reported done with no lock handle"),
        engine_.get());
  }
  AddHandle(rpc.session, event.lock_handle);
  rpc.done.push_back(event);
}

// The handler's loop, without waiting. Returns true when the RPC is over.
bool Run::PumpLoad(LoadRpc& rpc) {
  while (rpc.stream->pending() && !rpc.cancelled->load()) {
    std::optional<LoadStream::Event> event =
        rpc.stream->Next(absl::InfinitePast());
    if (!event.has_value()) break;
    TakeLoadEvent(rpc, *event);
  }
  return !rpc.stream->pending() || rpc.cancelled->load();
}

// The rest of the RPC. With `wait`, as a client that reads to the end
// (every outcome must come); without, as one that cancels now.
absl::Status Run::FinishLoadRpc(LoadRpc& rpc, bool wait) {
  if (wait) {
    Settle();
    const absl::Time deadline = absl::Now() + kHung;
    while (rpc.stream->pending() && !rpc.cancelled->load()) {
      std::optional<LoadStream::Event> event = rpc.stream->Next(deadline);
      if (!event.has_value()) {
        if (rpc.stream->overflowed()) break;
        Fail(absl::StrCat("LoadBack of ", rpc.session, " never reported loads ",
                          absl::StrJoin(rpc.loads, ","), " done within ",
                          absl::FormatDuration(kHung),
                          " after every copy completed"),
             engine_.get());
      }
      TakeLoadEvent(rpc, *event);
    }
  }
  const bool overflowed = rpc.stream->overflowed();
  rpc.stream.reset();  // Abandons what still runs; the stream ends.
  return overflowed ? absl::ResourceExhaustedError(
                          "load-back stream cut off: read too slowly")
                    : absl::OkStatus();
}

void Run::TakeWorkerEvent(SubscribeRpc& sub, const OpEvent& event) {
  ++sub.events;
  if (event.rank != sub.rank) {
    Fail(absl::StrCat("the subscription of worker ", sub.session, " (rank ",
                      sub.rank, ") got an event for rank ", event.rank, " (op ",
                      event.op, ")"),
         engine_.get());
  }
  auto ns = op_ns_.find(event.op);
  if (ns != op_ns_.end() && ns->second != sub.ns) {
    Fail(absl::StrCat("the subscription of worker ", sub.session,
                      " (namespace '", sub.ns, "') got an event of op ",
                      event.op, " of namespace '", ns->second, "'"),
         engine_.get());
  }
}

// The handler's loop, without waiting; the RPC ends when the subscription
// does (its session ended, or it overflowed).
void Run::PumpSubscription(SubscribeRpc& sub) {
  if (sub.stream == nullptr) return;
  while (std::optional<OpEvent> event =
             sub.stream->Next(absl::InfinitePast())) {
    TakeWorkerEvent(sub, *event);
  }
  if (sub.stream->ended() || sub.cancelled->load()) {
    Trace("    Subscribe of '", sub.session, "' ends after ", sub.events,
          " events", sub.stream->overflowed() ? " (overflowed)" : "");
    sub.stream.reset();
  }
}

// After every op: the streams' server sides run as far as they can.
void Run::PumpStreams() {
  for (BackupRpc& rpc : streams_) {
    PumpBackup(rpc);
    if (rpc.stream != nullptr && !rpc.input_ended && rpc.cancelled->load()) {
      // The overflow cancelled the RPC: its reader stops, broken.
      EndBackup(rpc, /*broken=*/true);
    }
  }
  for (auto it = loads_.begin(); it != loads_.end();) {
    if ((*it)->live && PumpLoad(**it)) {
      Check("LoadBack (live) ends", FinishLoadRpc(**it, /*wait=*/false));
      it = loads_.erase(it);
    } else {
      ++it;
    }
  }
  for (SubscribeRpc& sub : subs_) PumpSubscription(sub);
}

void Run::EndStreams(bool broken, bool sessions_closed) {
  for (std::unique_ptr<LoadRpc>& load : loads_) {
    Check("teardown LoadBack", FinishLoadRpc(*load, /*wait=*/!broken));
  }
  loads_.clear();
  for (BackupRpc& rpc : streams_) EndBackup(rpc, broken);
  for (SubscribeRpc& sub : subs_) {
    if (sub.stream == nullptr) continue;
    if (sessions_closed) {
      Settle();
      PumpSubscription(sub);
      if (sub.stream != nullptr) {
        Fail(absl::StrCat("the subscription of ", sub.session,
                          " did not end when its session closed"),
             engine_.get());
      }
    }
    sub.stream.reset();  // The client cancels.
  }
}

}  // namespace hicache::fuzz
