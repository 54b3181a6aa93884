// libFuzzer target: drives the in-process service layer (service::HiCacheService
// over a real HiCacheEngine, SessionManager and EventHub) with sequences of
// RPCs decoded from the input, the way a buggy or hostile client would, and
// checks after every input that no page leaked or is held twice.
//
// Input format (see fuzz/corpus/make_seeds.py, which writes the seeds):
//   byte 0  cp_size = 1 + (b & 3); write policy ((b >> 2) & 3) % 3 (through,
//           selective, back); eviction policy (b >> 4) & 1 ? LFU : LRU;
//           (b >> 5) & 1: settle (wait for every copy) after each op;
//           (b >> 6) & 1: "tiny-draft" preset (3 steps) instead of "tiny"
//           (2 steps).
//   byte 1  device pages per rank {8, 16, 32, 64}[b & 3]; host pages per rank
//           {8, 32, 64, 128}[(b >> 2) & 3]; (b >> 4) & 1: page-first host
//           layout; (b >> 5) & 1: load-back threshold 8 tokens; b >> 6:
//           injected copy failures (FaultyTransferEngine, random, seeded by
//           bytes 0-1) with probability {0, 5%, 20%, 50%} per copy.
//   then    ops: one opcode byte (Op below, modulo kNumOps) and its operand
//           bytes, until the input ends (reads past the end give 0) or
//           kMaxOps ops ran.
// Page size is 4 tokens. Tokens come from three base sequences that share
// prefixes (so matches, splits and duplicates happen) or from the input over
// the alphabet {0, 1, 2}.
//
// Streaming RPCs (BackupSession, LoadBack) need a grpc::ServerContext and a
// ServerReaderWriter, which cannot be built in-process; their message
// handlers are replayed here against SessionManager, EventHub and
// EventMailbox as daemon/service/hicache_service_streams.cc does (Service,
// below).
//
// After every op: engine->CheckInvariants(), and no RPC may answer INTERNAL,
// UNKNOWN or DATA_LOSS. After every input: every stream ends (an outcome the
// stream waits for must arrive) and every session is closed, copies settle,
// and then: invariants hold, the session totals are zero, every allocated
// device page is the tree's, no node is locked, every reserved host page
// belongs to a committed node, and after unpinning and evicting everything both
// pools are empty. Any violation prints what failed and traps, so libFuzzer
// reports a crash.
//
// Environment: HICACHE_FUZZ_TRACE=1 prints every op and its status (use it on
// a reproducer); HICACHE_FUZZ_LOG=1 keeps the daemon's log.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "daemon/backend/cpu/cpu_transfer_engine.h"
#include "daemon/core/clock.h"
#include "daemon/engine/caller.h"
#include "daemon/engine/event_hub.h"
#include "daemon/engine/event_mailbox.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"
#include "daemon/pool/kv_pool.h"
#include "daemon/service/caller_resolver.h"
#include "daemon/service/hicache_service.h"
#include "grpcpp/server_context.h"
#include "daemon/service/watch_broadcaster.h"
#include "daemon/transfer/faulty_transfer_engine.h"
#include "hicache/v1/hicache.pb.h"
#include "spdlog/spdlog.h"

namespace hicache::fuzz {
namespace {

constexpr uint32_t kPageSize = 4;
constexpr int kMaxOps = 200;
constexpr int kSlots = 4;
constexpr size_t kMaxKnown = 64;  // Remembered page / node / backup ids.

bool g_trace = false;

// ---------------------------------------------------------------------------
// Failure reporting.

[[noreturn]] void Fail(const std::string& what, const HiCacheEngine* engine) {
  std::fprintf(stderr, "\nservice_fuzzer: INVARIANT VIOLATED: %s\n",
               what.c_str());
  if (engine != nullptr) {
    std::fprintf(stderr, "service_fuzzer: accounting: %s\n",
                 engine->AccountingString().c_str());
  }
  std::fflush(stderr);
  __builtin_trap();
}

template <typename... Args>
void Trace(const Args&... args) {
  if (!g_trace) return;
  std::fprintf(stderr, "  %s\n", absl::StrCat(args...).c_str());
}

// ---------------------------------------------------------------------------
// Pools on the heap: no shared-memory segments per input.

class HeapPool final : public KvPool {
 public:
  HeapPool(std::string name, uint64_t size)
      : name_(std::move(name)), size_(size), data_(new uint8_t[size]()) {}
  const std::string& name() const override { return name_; }
  uint64_t size_bytes() const override { return size_; }
  void* host_data() const override { return data_.get(); }
  void* backend_data() const override { return data_.get(); }
  PoolExport Export() const override {
    return {PoolExport::Kind::kSharedMemory, name_, size_};
  }

 private:
  const std::string name_;
  const uint64_t size_;
  const std::unique_ptr<uint8_t[]> data_;
};

class HeapPools final : public PoolBackend {
 public:
  absl::StatusOr<std::unique_ptr<KvPool>> CreateDevicePool(
      Rank rank, uint64_t size_bytes) override {
    if (size_bytes == 0) return absl::InvalidArgumentError("size 0");
    return std::make_unique<HeapPool>(absl::StrCat("/fuzz-device-r", rank),
                                      size_bytes);
  }
  absl::StatusOr<std::unique_ptr<KvPool>> CreateHostPool(
      Rank rank, uint64_t size_bytes, bool /*lock_memory*/) override {
    if (size_bytes == 0) return absl::InvalidArgumentError("size 0");
    return std::make_unique<HeapPool>(absl::StrCat("/fuzz-host-r", rank),
                                      size_bytes);
  }
};

// Heap pools and the CPU backend's copy engine: no shared memory per input.
class HeapBackend final : public Backend {
 public:
  std::string name() const override { return "heap"; }
  PoolBackend& pools() override { return pools_; }
  absl::Status CheckCapacity(const RankPools::Sizes&) override {
    return absl::OkStatus();
  }
  std::unique_ptr<TransferEngine> CreateTransferEngine(
      const RankPools* pools, TransferListener* listener) override {
    return std::make_unique<CpuTransferEngine>(pools, listener, 1);
  }

 private:
  HeapPools pools_;
};

// ---------------------------------------------------------------------------
// The one place that knows how the service is called: each RPC with a
// fresh ServerContext, the caller's identity (daemon/engine/caller.h) coming
// from a resolver that Call() sets first. Session RPCs are made as a plain
// client, Evict / SetFreeRoom / DumpTree / InspectNode / ListSessions as an
// operator (or, to check the refusal, as a client).
//
// The streaming RPCs (BackupSession, LoadBack) need a grpc::ServerContext
// and a reader/writer, which cannot be built in-process. BackupStream and
// LoadStream replay what HiCacheService::BackupSession / LoadBack do with each
// client message, on the same SessionManager, EventHub and EventMailbox
// calls; keep them in step with daemon/service/hicache_service_streams.cc.

// A BackupSession stream. Its session is fixed by the first message.
struct BackupStream {
  std::string session;
  std::shared_ptr<EventMailbox> box;
  std::set<uint64_t> open;     // Prepared, outcome not yet streamed.
  std::set<uint64_t> claimed;  // Every id claimed in the hub.
};

// A LoadBack stream after its `started` message.
struct LoadStream {
  std::string session;
  uint64_t op = 0;
  NodeId node = kNoNode;
  std::shared_ptr<EventMailbox> box;
};

class Service {
 public:
  // How long a stream may wait for an outcome that the engine owes it before
  // the fuzzer calls it hung (every copy has completed by then).
  static constexpr absl::Duration kHung = absl::Seconds(10);

  // Whoever Call() says the caller is.
  class Callers final : public service::CallerResolver {
   public:
    Caller Resolve(const grpc::ServerContext&) const override { return next; }
    Caller next;
  };

  Service(service::HiCacheService* rpcs, Callers* callers,
          SessionManager* sessions, HiCacheEngine* engine, EventHub* hub)
      : rpcs_(rpcs),
        callers_(callers),
        sessions_(sessions),
        engine_(engine),
        hub_(hub) {}

  static const Caller& Client() {
    static const Caller* const caller = new Caller{false, "fuzz client"};
    return *caller;
  }
  static const Caller& Operator() {
    static const Caller* const caller = new Caller{true, "fuzz operator"};
    return *caller;
  }

  // Unary RPCs.
  grpc::Status OpenSession(const v1::OpenSessionRequest& request,
                           v1::OpenSessionResponse* response) {
    return Call(Client(), &service::HiCacheService::OpenSession, &request, response);
  }
  grpc::Status KeepAlive(const v1::KeepAliveRequest& request) {
    v1::KeepAliveResponse response;
    return Call(Client(), &service::HiCacheService::KeepAlive, &request, &response);
  }
  grpc::Status CloseSession(const v1::CloseSessionRequest& request) {
    v1::CloseSessionResponse response;
    return Call(Client(), &service::HiCacheService::CloseSession, &request,
                &response);
  }
  grpc::Status GetLayout() {
    v1::GetLayoutResponse response;
    return Call(Client(), &service::HiCacheService::GetLayout,
                &v1::GetLayoutRequest::default_instance(), &response);
  }
  grpc::Status Allocate(const v1::AllocateRequest& request,
                        v1::AllocateResponse* response) {
    return Call(Client(), &service::HiCacheService::Allocate, &request, response);
  }
  grpc::Status Free(const v1::FreeRequest& request) {
    return Call(Client(), &service::HiCacheService::Free, &request,
                &free_response_);
  }
  grpc::Status MatchPrefix(const v1::MatchPrefixRequest& request,
                           v1::MatchPrefixResponse* response) {
    return Call(Client(), &service::HiCacheService::MatchPrefix, &request,
                response);
  }
  grpc::Status Insert(const v1::InsertRequest& request,
                      v1::InsertResponse* response) {
    return Call(Client(), &service::HiCacheService::Insert, &request, response);
  }
  grpc::Status Lock(const v1::LockRequest& request, bool lock) {
    v1::LockResponse response;
    return Call(Client(),
                lock ? &service::HiCacheService::Lock
                     : &service::HiCacheService::Unlock,
                &request, &response);
  }
  grpc::Status Pin(const v1::PinRequest& request) {
    return Call(Client(), &service::HiCacheService::Pin, &request,
                &pin_response_);
  }
  grpc::Status Stats() {
    v1::CacheStats response;
    return Call(Client(), &service::HiCacheService::Stats,
                &v1::GetStatsRequest::default_instance(), &response);
  }
  // Operator RPCs; `as` is Operator() except to check the refusal.
  grpc::Status Evict(const Caller& as, const v1::EvictRequest& request) {
    v1::EvictResponse response;
    return Call(as, &service::HiCacheService::Evict, &request, &response);
  }
  grpc::Status SetFreeRoom(const Caller& as,
                           const v1::SetFreeRoomRequest& request) {
    return Call(as, &service::HiCacheService::SetFreeRoom, &request,
                &free_room_response_);
  }
  grpc::Status DumpTree(const Caller& as, const v1::DumpTreeRequest& request) {
    v1::DumpTreeResponse response;
    return Call(as, &service::HiCacheService::DumpTree, &request, &response);
  }
  grpc::Status InspectNode(const Caller& as,
                           const v1::InspectNodeRequest& request) {
    v1::NodeInfo response;
    return Call(as, &service::HiCacheService::InspectNode, &request, &response);
  }
  grpc::Status ListSessions(const Caller& as,
                            v1::ListSessionsResponse* response) {
    return Call(as, &service::HiCacheService::ListSessions,
                &v1::ListSessionsRequest::default_instance(), response);
  }

  // --- BackupSession --------------------------------------------------------

  // One client message on `stream` (a new stream when its session is empty).
  // Returns what the server would stream as `error` (or end the RPC with);
  // `prepared` receives a prepare's ids. *ended is set when the server ends
  // the stream after this message.
  absl::Status BackupMessage(BackupStream& stream,
                             const v1::BackupClientMessage& in,
                             std::vector<uint64_t>* prepared, bool* ended) {
    *ended = false;
    if (stream.session.empty()) {
      // The first message names the session and opens the stream.
      if (in.session_id().empty()) {
        *ended = true;
        return absl::InvalidArgumentError(
            "every BackupSession message must carry the stream's session_id");
      }
      if (absl::Status s = sessions_->BeginStream(in.session_id()); !s.ok()) {
        *ended = true;
        return s;
      }
      stream.session = in.session_id();
      stream.box = std::make_shared<EventMailbox>(
          service::StreamLimits().max_backlog, [] {});
    } else if (!in.session_id().empty() && in.session_id() != stream.session) {
      *ended = true;
      EndBackupStream(stream, /*broken=*/true);
      return absl::InvalidArgumentError(
          "every BackupSession message must carry the stream's session_id");
    }
    const std::string& session = stream.session;
    if (in.has_prepare()) {
      std::vector<BackupSpec> specs;
      for (const v1::BackupSpec& spec : in.prepare().specs()) {
        specs.push_back(
            {std::vector<LogicalPage>(spec.pages().begin(), spec.pages().end()),
             spec.logical_tokens()});
      }
      absl::StatusOr<std::vector<uint64_t>> ids =
          sessions_->PrepareBackups(session, specs);
      if (!ids.ok()) return ids.status();
      for (uint64_t id : *ids) {
        if (id == 0) continue;
        stream.open.insert(id);
        stream.claimed.insert(id);
        hub_->Claim(id, stream.box);
      }
      if (prepared != nullptr) *prepared = *std::move(ids);
      return absl::OkStatus();
    }
    if (in.has_layer_stored()) {
      std::vector<uint64_t> ids(in.layer_stored().backup_ids().begin(),
                                in.layer_stored().backup_ids().end());
      return sessions_->LayerStored(session, ids, in.layer_stored().step());
    }
    if (in.has_store_all()) {
      return sessions_->StoreAll(session, in.store_all().backup_id());
    }
    if (in.has_rollback()) {
      return sessions_->Rollback(session, in.rollback().backup_id());
    }
    return absl::InvalidArgumentError("empty BackupClientMessage");
  }

  // The stream's writer thread, without blocking: streams what has arrived
  // and forgets finished backups.
  void PumpBackupEvents(BackupStream& stream) {
    if (stream.box == nullptr) return;
    while (std::optional<OpEvent> event =
               stream.box->Wait(absl::InfinitePast())) {
      TakeBackupEvent(stream, *event);
    }
  }

  // The client half-closed (`broken` false) or the stream broke. As the
  // service: roll back what can no longer complete, stream the outcomes of
  // the rest as their copies finish, then end. Returns false if an outcome
  // never came (the RPC would never end).
  bool EndBackupStream(BackupStream& stream, bool broken) {
    if (stream.session.empty()) return true;
    std::vector<uint64_t> doomed;
    for (uint64_t id : stream.open) {
      absl::StatusOr<bool> waits = engine_->BackupAwaitsClient(id);
      if (broken || (waits.ok() && *waits)) doomed.push_back(id);
    }
    for (uint64_t id : doomed) (void)sessions_->Rollback(stream.session, id);
    bool ended = true;
    if (!stream.open.empty()) {
      engine_->WaitForTransfers();
      const absl::Time deadline = absl::Now() + kHung;
      while (!stream.open.empty()) {
        std::optional<OpEvent> event = stream.box->Wait(deadline);
        if (!event.has_value()) {
          ended = false;
          break;
        }
        TakeBackupEvent(stream, *event);
      }
    }
    stream.box->Close();
    PumpBackupEvents(stream);
    for (uint64_t id : stream.claimed) hub_->Forget(id);
    sessions_->EndStream(stream.session);
    if (!ended) {
      hung_ = absl::StrCat("BackupSession of ", stream.session,
                           " never streamed the outcome of backups ",
                           absl::StrJoin(stream.open, ","),
                           " after every copy completed");
    }
    stream = BackupStream();
    return ended;
  }

  // --- LoadBack -------------------------------------------------------------

  // The stream up to `started`; a LoadStream when a load runs.
  absl::StatusOr<std::optional<LoadStream>> LoadBackStart(
      const std::string& session, const std::string& packed,
      LoadResult* result) {
    if (packed.size() % 4 != 0) {
      return absl::InvalidArgumentError("tokens: not a multiple of 4 bytes");
    }
    std::vector<int32_t> tokens(packed.size() / 4);
    if (!packed.empty())
      std::memcpy(tokens.data(), packed.data(), packed.size());
    if (absl::Status s = sessions_->BeginStream(session); !s.ok()) return s;
    absl::StatusOr<LoadResult> load = sessions_->LoadBack(session, tokens);
    if (!load.ok()) {
      sessions_->EndStream(session);
      return load.status();
    }
    *result = *load;
    if (load->op_id == 0) {
      sessions_->EndStream(session);
      return std::optional<LoadStream>();
    }
    LoadStream stream{session, load->op_id, load->node,
                      std::make_shared<EventMailbox>(
                          service::StreamLimits().max_backlog, [] {})};
    hub_->Claim(load->op_id, stream.box);
    return std::optional<LoadStream>(std::move(stream));
  }

  // The rest of the stream. With `wait`, as a client that reads to the end
  // (the load's outcome must come); without, as one that cancels now.
  absl::Status LoadBackFinish(LoadStream& load, bool wait) {
    bool ok = false;
    bool done = false;
    if (wait) engine_->WaitForTransfers();
    const absl::Time deadline =
        wait ? absl::Now() + kHung : absl::InfinitePast();
    while (std::optional<OpEvent> event = load.box->Wait(deadline)) {
      if (event->type == OpEvent::Type::kLoadDone) {
        ok = event->ok;
        done = true;
        break;
      }
    }
    if (wait && !done) {
      hung_ = absl::StrCat("LoadBack ", load.op, " of ", load.session,
                           " never reported done after every copy completed");
    }
    hub_->Forget(load.op);
    if (ok) (void)sessions_->Lock(load.session, {load.node});
    absl::Status finished = sessions_->FinishLoad(load.session, load.op);
    sessions_->EndStream(load.session);
    return finished;
  }

  // The lease reaper of DaemonServer.
  int ExpireLapsed() { return sessions_->ExpireLapsed(); }

  // Why a stream would never end, or empty.
  const std::string& hung() const { return hung_; }

 private:
  template <typename Request, typename Response>
  grpc::Status Call(const Caller& caller,
                    grpc::Status (service::HiCacheService::*method)(
                        grpc::ServerContext*, const Request*, Response*),
                    const Request* request, Response* response) {
    callers_->next = caller;
    grpc::ServerContext context;
    return (rpcs_->*method)(&context, request, response);
  }

  void TakeBackupEvent(BackupStream& stream, const OpEvent& event) {
    if (event.type != OpEvent::Type::kCommitted &&
        event.type != OpEvent::Type::kRolledBack) {
      return;
    }
    sessions_->BackupFinished(stream.session, event.op);
    stream.open.erase(event.op);
  }

  service::HiCacheService* const rpcs_;
  Callers* const callers_;
  SessionManager* const sessions_;
  HiCacheEngine* const engine_;
  EventHub* const hub_;
  std::string hung_;
  v1::FreeResponse free_response_;
  v1::PinResponse pin_response_;
  v1::SetFreeRoomResponse free_room_response_;
};

// ---------------------------------------------------------------------------
// Input decoding.

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  size_t Below(size_t n) { return n == 0 ? 0 : Byte() % n; }
  bool Bit() { return (Byte() & 1) != 0; }
  // Mostly small values, sometimes an edge case.
  int64_t Count() {
    const uint8_t b = Byte();
    if (b < 224) return b % 20;
    static constexpr int64_t kEdges[] = {
        -1,
        -2,
        std::numeric_limits<int64_t>::min(),
        std::numeric_limits<int64_t>::max(),
        int64_t{1} << 31,
        int64_t{1} << 32,
        int64_t{1} << 62,
        int64_t{1} << 29,
        63,
        64,
        65,
        127,
        128,
        4096,
        -4096,
        (int64_t{1} << 31) - 1,
    };
    return kEdges[(b - 224) % std::size(kEdges)];
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

std::string Pack(const std::vector<int32_t>& tokens) {
  return std::string(reinterpret_cast<const char*>(tokens.data()),
                     tokens.size() * sizeof(int32_t));
}

// Four base sequences: 1 shares 12 tokens (3 pages) with 0, 2 shares 5 (a page
// and one token) with 0, 3 is read from the input over {0, 1, 2}.
int32_t BaseToken(int base, size_t i) {
  const int32_t t0 = static_cast<int32_t>((i * 7 + 3) % 13);
  switch (base) {
    case 0:
      return t0;
    case 1:
      return i < 12 ? t0 : static_cast<int32_t>(50 + i % 5);
    default:
      return i < 5 ? t0 : static_cast<int32_t>(70 + (i * 3) % 7);
  }
}

struct Tokens {
  std::vector<int32_t> tokens;
  bool malformed = false;  // Packed with a stray byte (not a multiple of 4).
  std::string Packed() const {
    std::string bytes = Pack(tokens);
    if (malformed) bytes.push_back('\x01');
    return bytes;
  }
};

Tokens ReadTokens(Input& in) {
  const uint8_t b = in.Byte();
  const int base = b & 3;
  Tokens out;
  if (base == 3) {
    const size_t len = in.Below(25);
    for (size_t i = 0; i < len; ++i) out.tokens.push_back(in.Byte() % 3);
  } else {
    const size_t len = in.Below(41);
    for (size_t i = 0; i < len; ++i) out.tokens.push_back(BaseToken(base, i));
  }
  if ((b & 4) != 0 && !out.tokens.empty()) {
    const size_t at = in.Below(out.tokens.size());
    out.tokens[at] = 100 + in.Byte() % 4;
  }
  out.malformed = (b >> 3) == 31;
  return out;
}

int64_t PagesFor(size_t tokens) {
  return static_cast<int64_t>((tokens + kPageSize - 1) / kPageSize);
}

template <typename T>
void Remember(std::vector<T>& known, T value) {
  if (std::find(known.begin(), known.end(), value) != known.end()) return;
  if (known.size() >= kMaxKnown) known.erase(known.begin());
  known.push_back(value);
}

bool IsBrokenState(grpc::StatusCode code) {
  return code == grpc::StatusCode::INTERNAL ||
         code == grpc::StatusCode::UNKNOWN ||
         code == grpc::StatusCode::DATA_LOSS;
}

// ---------------------------------------------------------------------------
// One input: a fresh daemon (engine, sessions, service) and the ops on it.

enum Op : uint8_t {
  kOpen,
  kClose,
  kAllocate,
  kFree,
  kMatch,
  kInsert,
  kLock,
  kPin,
  kEvict,
  kSetFreeRoom,
  kPrepare,
  kLayerStored,
  kStoreAll,
  kRollback,
  kStreamEnd,
  kLoadBack,
  kFinishLoad,
  kSettle,
  kAdvanceClock,
  kKeepAlive,
  kInspect,
  kRequest,  // A whole request: match, allocate, back up, insert, unlock.
  kNumOps,
};

const char* OpName(int op) {
  static constexpr const char* kNames[] = {
      "Open",     "Close",       "Allocate", "Free",     "Match",
      "Insert",   "Lock",        "Pin",      "Evict",    "SetFreeRoom",
      "Prepare",  "LayerStored", "StoreAll", "Rollback", "StreamEnd",
      "LoadBack", "FinishLoad",  "Settle",   "Advance",  "KeepAlive",
      "Inspect",  "Request"};
  static_assert(std::size(kNames) == kNumOps);
  return kNames[op];
}

struct SessionState {
  std::string id;
  // Pages this session allocated and still holds, as far as the fuzzer can
  // tell (inserts that the tree adopted and frees remove them).
  std::vector<LogicalPage> owned;
  // Device pages of its last match (the tree's pages, insertable).
  std::vector<LogicalPage> matched;
};

class Run {
 public:
  explicit Run(Input& in) : in_(in) {}

  // Builds the daemon the header bytes describe.
  void Start() {
    const uint8_t h0 = in_.Byte();
    const uint8_t h1 = in_.Byte();
    EngineOptions options;
    options.page_size = kPageSize;
    options.cp_size = 1 + (h0 & 3);
    options.write_policy = static_cast<WritePolicy>(((h0 >> 2) & 3) % 3);
    options.eviction_policy =
        ((h0 >> 4) & 1) != 0 ? EvictionPolicy::kLfu : EvictionPolicy::kLru;
    settle_each_op_ = ((h0 >> 5) & 1) != 0;
    options.kv_preset = ((h0 >> 6) & 1) != 0 ? "tiny-draft" : "tiny";
    static constexpr int64_t kDevice[] = {8, 16, 32, 64};
    static constexpr int64_t kHost[] = {8, 32, 64, 128};
    options.device_pages_per_rank = kDevice[h1 & 3];
    options.host_pages_per_rank = kHost[(h1 >> 2) & 3];
    options.host_layout =
        ((h1 >> 4) & 1) != 0 ? HostLayout::kPageFirst : HostLayout::kLayerFirst;
    options.load_back_threshold_tokens = ((h1 >> 5) & 1) != 0 ? 8 : 0;
    options.transfer_workers = 1;
    options.clock = &clock_;
    options.backend = &backend_;
    static constexpr double kFaults[] = {0, 0.05, 0.2, 0.5};
    const double fault = kFaults[h1 >> 6];
    if (fault > 0) {
      options.wrap_transfer = [fault, seed = uint64_t{h0} << 8 | h1](
                                  TransferListener* listener,
                                  const TransferEngineFactory& backend) {
        auto faulty = std::make_unique<FaultyTransferEngine>(listener, backend);
        faulty->SetRandom({.seed = seed,
                           .device_to_host = fault,
                           .host_to_device = fault});
        return std::unique_ptr<TransferEngine>(std::move(faulty));
      };
    }
    Trace("config: cp_size=", options.cp_size,
          " write_policy=", PolicyName(options.write_policy),
          " preset=", options.kv_preset,
          " device/rank=", options.device_pages_per_rank,
          " host/rank=", options.host_pages_per_rank,
          " settle_each_op=", settle_each_op_, " faults=", fault);
    absl::StatusOr<std::unique_ptr<HiCacheEngine>> engine =
        HiCacheEngine::Create(options);
    if (!engine.ok()) Fail(engine.status().ToString(), nullptr);
    engine_ = *std::move(engine);
    engine_->SetListener(&hub_);
    cp_ = options.cp_size;
    steps_ = engine_->geometry().NumSteps();
    sessions_ = std::make_unique<SessionManager>(engine_.get(), &clock_,
                                                 absl::Seconds(10));
    rpcs_ = std::make_unique<service::HiCacheService>(
        DaemonInfo{}, &clock_,
        service::ServiceParts{.engine = engine_.get(),
                              .sessions = sessions_.get(),
                              .hub = &hub_,
                              .watch = &watch_,
                              .callers = &callers_});
    service_ = std::make_unique<Service>(rpcs_.get(), &callers_,
                                         sessions_.get(), engine_.get(), &hub_);
  }

  void Ops() {
    for (int i = 0; i < kMaxOps && !in_.done(); ++i) {
      const int op = in_.Byte() % kNumOps;
      Trace("op ", i, ": ", OpName(op));
      Do(op);
      if (settle_each_op_) engine_->WaitForTransfers();
      // The streams' writer threads.
      for (BackupStream& stream : streams_) service_->PumpBackupEvents(stream);
      if (!service_->hung().empty()) Fail(service_->hung(), engine_.get());
      if (absl::Status s = engine_->CheckInvariants(); !s.ok()) {
        Fail(absl::StrCat("after op ", i, " (", OpName(op),
                          "): CheckInvariants: ", s.ToString()),
             engine_.get());
      }
    }
  }

  // Closes everything, settles and checks that every page is accounted for.
  // The clients go away: streams end (half-closed, or broken, before or
  // after the sessions close, as the last input byte says).
  void Finish() {
    const uint8_t b = in_.Byte();
    const bool streams_first = (b & 1) == 0;
    if (streams_first) EndStreams((b & 2) != 0);
    for (const std::string& id : opened_) {
      v1::CloseSessionRequest request;
      request.set_session_id(id);
      Check("teardown CloseSession", service_->CloseSession(request));
    }
    if (!streams_first) EndStreams((b & 2) != 0);
    engine_->WaitForTransfers();
    CheckSettled("after closing every session");
    Drain();
  }

  void EndStreams(bool broken) {
    for (LoadStream& load : loads_) {
      Check("teardown LoadBack.finish",
            service_->LoadBackFinish(load, /*wait=*/!broken));
    }
    loads_.clear();
    for (BackupStream& stream : streams_) {
      if (!service_->EndBackupStream(stream, broken)) {
        Fail(service_->hung(), engine_.get());
      }
    }
    if (!service_->hung().empty()) Fail(service_->hung(), engine_.get());
  }

  ~Run() {
    // Destroy in dependency order: service, sessions, then the engine (which
    // stops its transfer workers) before the hub it reports to.
    service_.reset();
    rpcs_.reset();
    sessions_.reset();
    engine_.reset();
  }

 private:
  // --- Helpers -------------------------------------------------------------

  void Check(absl::string_view what, const grpc::Status& status) {
    Trace("    -> ", what, ": ", status.error_code(), " ",
          status.error_message());
    if (IsBrokenState(status.error_code())) {
      Fail(absl::StrCat(what, " answered code ", status.error_code(), ": ",
                        status.error_message()),
           engine_.get());
    }
  }
  void Check(absl::string_view what, const absl::Status& status) {
    Trace("    -> ", what, ": ", status.ToString());
    if (absl::IsInternal(status) || absl::IsUnknown(status) ||
        absl::IsDataLoss(status)) {
      Fail(absl::StrCat(what, ": ", status.ToString()), engine_.get());
    }
  }

  // A session slot, or (1 in 5) an id that is not an open session.
  // `slot_out` receives the slot index (kSlots for none).
  std::string PickSessionId(SessionState** state, int* slot_out = nullptr) {
    const uint8_t b = in_.Byte();
    *state = nullptr;
    const int slot = b % (kSlots + 1);
    if (slot_out != nullptr) *slot_out = slot;
    if (slot < kSlots && slots_[slot].has_value()) {
      *state = &*slots_[slot];
      return slots_[slot]->id;
    }
    if (!opened_.empty() && (b & 0x10) != 0) {
      return opened_[(b >> 5) % opened_.size()];  // Maybe closed.
    }
    return (b & 0x20) != 0 ? "" : "s999-0000000000000000";
  }

  LogicalPage PickPage(SessionState* s) {
    const uint8_t b = in_.Byte();
    if (b < 96 && s != nullptr && !s->owned.empty()) {
      return s->owned[b % s->owned.size()];
    }
    if (b < 200 && !pages_.empty()) return pages_[b % pages_.size()];
    return static_cast<int64_t>(b) - 228;  // -28 .. 27, and 0.
  }

  std::vector<LogicalPage> PickPages(SessionState* s, size_t n) {
    std::vector<LogicalPage> pages;
    for (size_t i = 0; i < n; ++i) pages.push_back(PickPage(s));
    return pages;
  }

  NodeId PickNode() {
    const uint8_t b = in_.Byte();
    if (b < 224 && !nodes_.empty()) return nodes_[b % nodes_.size()];
    return static_cast<NodeId>(b % 8);  // 0 = no node, small ids = roots.
  }

  uint64_t PickBackup(SessionState* s) {
    const uint8_t b = in_.Byte();
    if (b < 128 && s != nullptr) {
      for (const BackupStream& stream : streams_) {
        if (stream.session == s->id && !stream.open.empty()) {
          auto it = stream.open.begin();
          std::advance(it, b % stream.open.size());
          return *it;
        }
      }
    }
    if (b < 224 && !backups_.empty()) return backups_[b % backups_.size()];
    return b % 4;
  }

  void ForgetOwned(SessionState* s, const std::vector<LogicalPage>& pages) {
    if (s == nullptr) return;
    for (LogicalPage p : pages) {
      s->owned.erase(std::remove(s->owned.begin(), s->owned.end(), p),
                     s->owned.end());
    }
  }

  // Which of the fuzzer's session slots are still open (after expiry).
  void SyncSlots() {
    v1::ListSessionsResponse list;
    Check("ListSessions", service_->ListSessions(Service::Operator(), &list));
    absl::flat_hash_set<std::string> open;
    for (const auto& s : list.sessions()) open.insert(s.session_id());
    for (auto& slot : slots_) {
      if (slot.has_value() && !open.contains(slot->id)) slot.reset();
    }
  }

  // --- Ops -----------------------------------------------------------------

  void Do(int op) {
    switch (op) {
      case kOpen:
        return OpenOp();
      case kClose:
        return CloseOp();
      case kAllocate:
        return AllocateOp();
      case kFree:
        return FreeOp();
      case kMatch:
        return MatchOp();
      case kInsert:
        return InsertOp();
      case kLock:
        return LockOp();
      case kPin:
        return PinOp();
      case kEvict:
        return EvictOp();
      case kSetFreeRoom:
        return SetFreeRoomOp();
      case kPrepare:
        return PrepareOp();
      case kLayerStored:
        return LayerStoredOp();
      case kStoreAll:
        return StoreAllOp();
      case kRollback:
        return RollbackOp();
      case kStreamEnd:
        return StreamEndOp();
      case kLoadBack:
        return LoadBackOp();
      case kFinishLoad:
        return FinishLoadOp();
      case kSettle:
        engine_->WaitForTransfers();
        return;
      case kAdvanceClock:
        return AdvanceOp();
      case kKeepAlive:
        return KeepAliveOp();
      case kInspect:
        return InspectOp();
      case kRequest:
        return RequestOp();
    }
  }

  void OpenOp() {
    const int slot = in_.Byte() % kSlots;
    const uint8_t b = in_.Byte();
    v1::OpenSessionRequest request;
    static constexpr const char* kNamespaces[] = {"", "a", "b", ""};
    request.set_namespace_(kNamespaces[b & 3]);
    static constexpr int kRoles[] = {v1::ROLE_SCHEDULER, v1::ROLE_WORKER,
                                     v1::ROLE_SCHEDULER, v1::ROLE_UNSPECIFIED,
                                     v1::ROLE_WORKER,    v1::ROLE_SCHEDULER,
                                     v1::ROLE_WORKER,    99};
    request.set_role(static_cast<v1::Role>(kRoles[(b >> 2) & 7]));
    request.set_client_name((b & 0x20) != 0 && (b & 0x40) != 0 ? "" : "fuzz");
    request.set_rank(in_.Byte() % (cp_ + 1));
    static constexpr uint32_t kLeases[] = {0, 50, 1000, 0xffffffffu};
    request.set_lease_ms(kLeases[(b >> 6) & 3]);
    v1::OpenSessionResponse response;
    const grpc::Status status = service_->OpenSession(request, &response);
    Check("OpenSession", status);
    if (!status.ok()) return;
    opened_.push_back(response.session_id());
    // The slot's previous client is done with its stream.
    if (!service_->EndBackupStream(streams_[slot], /*broken=*/false)) {
      Fail(service_->hung(), engine_.get());
    }
    slots_[slot].emplace();
    slots_[slot]->id = response.session_id();
  }

  void CloseOp() {
    SessionState* s;
    v1::CloseSessionRequest request;
    request.set_session_id(PickSessionId(&s));
    const grpc::Status status = service_->CloseSession(request);
    Check("CloseSession", status);
    for (auto& slot : slots_) {
      if (slot.has_value() && slot->id == request.session_id()) slot.reset();
    }
  }

  void AllocateOp() {
    SessionState* s;
    v1::AllocateRequest request;
    request.set_session_id(PickSessionId(&s));
    const size_t items = 1 + in_.Below(3);
    for (size_t i = 0; i < items; ++i) {
      v1::AllocateItem* item = request.add_items();
      const uint8_t b = in_.Byte();
      if ((b & 3) == 0) {  // An exact owner pattern.
        const size_t n = in_.Below(9);
        for (size_t j = 0; j < n; ++j) {
          item->add_owners(in_.Byte() % (cp_ + ((b & 4) != 0 ? 1 : 0)));
        }
      } else {
        int64_t n = in_.Count();
        item->set_num_pages(n);
        static constexpr int kModes[] = {
            v1::COMPUTE_OWNER_MODE_UNSPECIFIED, v1::COMPUTE_OWNER_MODE_ZIGZAG,
            v1::COMPUTE_OWNER_MODE_ROUND_ROBIN, 77};
        item->set_mode(static_cast<v1::ComputeOwnerMode>(kModes[b >> 6]));
      }
    }
    v1::AllocateResponse response;
    const grpc::Status status = service_->Allocate(request, &response);
    Check("Allocate", status);
    if (!status.ok()) return;
    for (const v1::Locations& list : response.allocations()) {
      for (int64_t p : list.pages()) {
        Remember(pages_, p);
        if (s != nullptr) s->owned.push_back(p);
      }
    }
  }

  void FreeOp() {
    SessionState* s;
    v1::FreeRequest request;
    request.set_session_id(PickSessionId(&s));
    std::vector<LogicalPage> pages = PickPages(s, in_.Below(5));
    request.mutable_pages()->Add(pages.begin(), pages.end());
    const grpc::Status status = service_->Free(request);
    Check("Free", status);
    if (status.ok()) ForgetOwned(s, pages);
  }

  // Returns the first result (empty when the call failed).
  std::optional<v1::MatchResult> Match(const std::string& id, SessionState* s,
                                       const std::vector<Tokens>& items,
                                       bool lock, bool peek) {
    v1::MatchPrefixRequest request;
    request.set_session_id(id);
    request.set_lock(lock);
    request.set_peek(peek);
    for (const Tokens& t : items) request.add_items()->set_tokens(t.Packed());
    v1::MatchPrefixResponse response;
    const grpc::Status status = service_->MatchPrefix(request, &response);
    Check("MatchPrefix", status);
    if (!status.ok() || response.results_size() == 0) return std::nullopt;
    for (const v1::MatchResult& r : response.results()) {
      for (int64_t p : r.device().pages()) Remember(pages_, p);
      if (r.last_device_node() != kNoNode) {
        Remember(nodes_, r.last_device_node());
      }
      if (r.last_host_node() != kNoNode) Remember(nodes_, r.last_host_node());
    }
    if (s != nullptr) {
      const auto& pages = response.results(0).device().pages();
      s->matched.assign(pages.begin(), pages.end());
    }
    return response.results(0);
  }

  void MatchOp() {
    SessionState* s;
    const std::string id = PickSessionId(&s);
    const uint8_t b = in_.Byte();
    std::vector<Tokens> items;
    const size_t n = 1 + (b & 1) + ((b >> 1) & 1);
    for (size_t i = 0; i < n; ++i) items.push_back(ReadTokens(in_));
    Match(id, s, items, (b & 4) != 0, (b & 8) != 0);
  }

  // Pages for an insert of `len` tokens: by default the matched (tree) pages
  // and then the session's own, as a well-behaved scheduler passes them.
  std::vector<LogicalPage> InsertPages(SessionState* s, size_t len) {
    const uint8_t b = in_.Byte();
    int64_t n = PagesFor(len);
    if ((b & 0x30) == 0x30) n += static_cast<int64_t>(in_.Below(3)) - 1;
    std::vector<LogicalPage> pages;
    if ((b & 3) != 3) {
      if (s != nullptr && (b & 4) == 0) {
        for (LogicalPage p : s->matched) {
          if (static_cast<int64_t>(pages.size()) < n) pages.push_back(p);
        }
      }
      const size_t start =
          (s != nullptr && !s->owned.empty()) ? (b >> 6) % s->owned.size() : 0;
      for (size_t i = 0; s != nullptr && i < s->owned.size() &&
                         static_cast<int64_t>(pages.size()) < n;
           ++i) {
        const LogicalPage p = s->owned[(start + i) % s->owned.size()];
        if (std::find(pages.begin(), pages.end(), p) == pages.end()) {
          pages.push_back(p);
        }
      }
    } else {
      // Anything: other sessions' pages, tree pages at other positions,
      // repeated and bogus ids.
      for (int64_t i = 0; i < std::max<int64_t>(n, 0); ++i) {
        pages.push_back(PickPage(s));
      }
    }
    return pages;
  }

  struct InsertItem {
    Tokens tokens;
    std::vector<LogicalPage> pages;
    bool unfinished = false;
    uint64_t backup = 0;
  };

  // Returns the first result (nullopt when the call failed).
  std::optional<v1::InsertResult> Insert(const std::string& id, SessionState* s,
                                         const std::vector<InsertItem>& items) {
    v1::InsertRequest request;
    request.set_session_id(id);
    for (const InsertItem& item : items) {
      v1::InsertItem* out = request.add_items();
      out->set_tokens(item.tokens.Packed());
      out->mutable_pages()->Add(item.pages.begin(), item.pages.end());
      out->set_unfinished(item.unfinished);
      out->set_backup_id(item.backup);
    }
    v1::InsertResponse response;
    const grpc::Status status = service_->Insert(request, &response);
    Check("Insert", status);
    if (!status.ok() || response.results_size() == 0) return std::nullopt;
    for (int i = 0; i < response.results_size(); ++i) {
      const v1::InsertResult& r = response.results(i);
      if (r.node() != kNoNode) Remember(nodes_, r.node());
      for (int64_t p : r.duplicate_pages()) Remember(pages_, p);
      for (int64_t p : r.uncached_pages()) Remember(pages_, p);
      if (s == nullptr || i >= static_cast<int>(items.size())) continue;
      // As SessionManager does: pages the tree adopted or freed leave the
      // session; uncached ones stay.
      if (!r.deferred()) {
        absl::flat_hash_set<LogicalPage> uncached(r.uncached_pages().begin(),
                                                  r.uncached_pages().end());
        std::vector<LogicalPage> gone;
        for (LogicalPage p : items[i].pages) {
          if (!uncached.contains(p)) gone.push_back(p);
        }
        ForgetOwned(s, gone);
      }
    }
    return response.results(0);
  }

  void InsertOp() {
    SessionState* s;
    const std::string id = PickSessionId(&s);
    std::vector<InsertItem> items(1 + in_.Below(2));
    for (InsertItem& item : items) {
      const uint8_t b = in_.Byte();
      item.tokens = ReadTokens(in_);
      item.pages = InsertPages(s, item.tokens.tokens.size());
      item.unfinished = (b & 1) != 0;
      if ((b & 6) == 6) item.backup = PickBackup(s);
    }
    Insert(id, s, items);
  }

  void LockOp() {
    SessionState* s;
    v1::LockRequest request;
    request.set_session_id(PickSessionId(&s));
    const uint8_t b = in_.Byte();
    const size_t n = 1 + (b & 3);
    for (size_t i = 0; i < n; ++i) request.add_nodes(PickNode());
    Check((b & 4) != 0 ? "Unlock" : "Lock",
          service_->Lock(request, (b & 4) == 0));
  }

  void PinOp() {
    SessionState* s;
    v1::PinRequest request;
    request.set_session_id(PickSessionId(&s));
    request.set_node(PickNode());
    static constexpr uint32_t kTtls[] = {0, 10, 1000, 0xffffffffu};
    request.set_ttl_ms(kTtls[in_.Byte() & 3]);
    Check("Pin", service_->Pin(request));
  }

  void EvictOp() {
    v1::EvictRequest request;
    const uint8_t b = in_.Byte();
    const Caller& as =
        (b & 0xC0) == 0xC0 ? Service::Client() : Service::Operator();
    const size_t lanes = (b & 7) % (cp_ + 2);
    const size_t ranks = ((b >> 3) & 7) % (cp_ + 2);
    for (size_t i = 0; i < lanes; ++i) {
      request.add_device_pages_per_lane(in_.Count());
    }
    for (size_t i = 0; i < ranks; ++i) {
      request.add_host_pages_per_rank(in_.Count());
    }
    Check("Evict", service_->Evict(as, request));
  }

  void SetFreeRoomOp() {
    v1::SetFreeRoomRequest request;
    int64_t l1 = in_.Count();
    int64_t l2 = in_.Count();
    request.set_l1_pages_per_lane(l1);
    request.set_l2_pages_per_rank(l2);
    Check("SetFreeRoom", service_->SetFreeRoom(Service::Operator(), request));
  }

  // BackupSession messages. Each session slot has one stream (streams_); a
  // message for an id that is no open slot goes on a scratch stream.
  // `b` bit 6 puts another session's id on the message (the server ends
  // the stream), bit 7 leaves the id out (allowed after the first).
  BackupStream& StreamFor(int slot, const std::string& id, uint8_t b,
                          v1::BackupClientMessage* message) {
    BackupStream& stream = streams_[std::min(slot, kSlots)];
    message->set_session_id(id);
    if (!stream.session.empty() && (b & 0x80) != 0) message->clear_session_id();
    if ((b & 0x40) != 0 && !opened_.empty()) {
      message->set_session_id(opened_[b % opened_.size()]);
    }
    return stream;
  }

  absl::Status Backup(int slot, const std::string& id, SessionState* s,
                      v1::BackupClientMessage& message, uint8_t b,
                      absl::string_view what,
                      std::vector<uint64_t>* prepared = nullptr) {
    BackupStream& stream = StreamFor(slot, id, b, &message);
    std::vector<uint64_t> ids;
    bool ended = false;
    const absl::Status status =
        service_->BackupMessage(stream, message, &ids, &ended);
    Check(what, status);
    for (uint64_t backup : ids) {
      Trace("    prepared backup ", backup);
      if (backup != 0) Remember(backups_, backup);
    }
    if (prepared != nullptr) *prepared = ids;
    if (ended || slot >= kSlots) {
      Trace("    stream ends");
      if (!service_->EndBackupStream(stream, /*broken=*/true)) {
        Fail(service_->hung(), engine_.get());
      }
    }
    return status;
  }

  void PrepareOp() {
    SessionState* s;
    int slot;
    const std::string id = PickSessionId(&s, &slot);
    v1::BackupClientMessage message;
    const uint8_t flags = in_.Byte();
    const size_t specs = 1 + (flags & 1);
    for (size_t i = 0; i < specs; ++i) {
      v1::BackupSpec* spec = message.mutable_prepare()->add_specs();
      const uint8_t b = in_.Byte();
      std::vector<LogicalPage> pages;
      if ((b & 1) == 0 && s != nullptr && !s->owned.empty()) {
        // A tail of the session's own pages, in order.
        const size_t n = 1 + in_.Below(std::min<size_t>(s->owned.size(), 8));
        pages.assign(s->owned.end() - n, s->owned.end());
      } else {
        pages = PickPages(s, in_.Below(5));
      }
      spec->mutable_pages()->Add(pages.begin(), pages.end());
      const int64_t full = static_cast<int64_t>(pages.size()) * kPageSize;
      spec->set_logical_tokens((b & 6) == 6 ? in_.Count()
                                            : full - in_.Below(kPageSize));
    }
    (void)Backup(slot, id, s, message, flags & 0xC0, "Backup.prepare");
  }

  void LayerStoredOp() {
    SessionState* s;
    int slot;
    const std::string id = PickSessionId(&s, &slot);
    const uint8_t flags = in_.Byte();
    v1::BackupClientMessage message;
    const size_t n = 1 + (flags & 1);
    for (size_t i = 0; i < n; ++i) {
      message.mutable_layer_stored()->add_backup_ids(PickBackup(s));
    }
    message.mutable_layer_stored()->set_step(in_.Below(steps_ + 2));
    (void)Backup(slot, id, s, message, flags & 0xC0, "Backup.layer_stored");
  }

  void StoreAllOp() {
    SessionState* s;
    int slot;
    const std::string id = PickSessionId(&s, &slot);
    const uint8_t flags = in_.Byte();
    v1::BackupClientMessage message;
    message.mutable_store_all()->set_backup_id(PickBackup(s));
    (void)Backup(slot, id, s, message, flags & 0xC0, "Backup.store_all");
  }

  void RollbackOp() {
    SessionState* s;
    int slot;
    const std::string id = PickSessionId(&s, &slot);
    const uint8_t flags = in_.Byte();
    v1::BackupClientMessage message;
    message.mutable_rollback()->set_backup_id(PickBackup(s));
    (void)Backup(slot, id, s, message, flags & 0xC0, "Backup.rollback");
  }

  // The client half-closes its stream (bit 0: the stream breaks instead).
  void StreamEndOp() {
    const uint8_t b = in_.Byte();
    BackupStream& stream = streams_[(b >> 1) % kSlots];
    Trace("    ending the stream of '", stream.session, "' with ",
          stream.open.size(), " backups open", (b & 1) != 0 ? ", broken" : "");
    if (!service_->EndBackupStream(stream, (b & 1) != 0)) {
      Fail(service_->hung(), engine_.get());
    }
  }

  void LoadBackOp() {
    SessionState* s;
    const std::string id = PickSessionId(&s);
    const Tokens tokens = ReadTokens(in_);
    const uint8_t b = in_.Byte();
    LoadResult result;
    absl::StatusOr<std::optional<LoadStream>> load =
        service_->LoadBackStart(id, tokens.Packed(), &result);
    Check("LoadBack", load.status());
    if (!load.ok()) return;
    Trace("    load ", result.op_id, " node ", result.node, " miss ",
          LoadMissReasonName(result.miss), " device ", result.device_len,
          " loaded ", result.loaded_len);
    for (LogicalPage p : result.pages) Remember(pages_, p);
    if (result.node != kNoNode) Remember(nodes_, result.node);
    if (!load->has_value()) return;
    if ((b & 2) != 0) {
      // Read to the end (bit 0) or cancel now.
      Check("LoadBack.finish", service_->LoadBackFinish(**load, (b & 1) != 0));
    } else {
      loads_.push_back(**std::move(load));
    }
  }

  void FinishLoadOp() {
    const uint8_t b = in_.Byte();
    if (loads_.empty()) return;
    const size_t i = (b >> 1) % loads_.size();
    LoadStream load = std::move(loads_[i]);
    loads_.erase(loads_.begin() + static_cast<ptrdiff_t>(i));
    Check("LoadBack.finish", service_->LoadBackFinish(load, (b & 1) != 0));
  }

  void AdvanceOp() {
    static constexpr absl::Duration kSteps[] = {
        absl::Milliseconds(20), absl::Seconds(1), absl::Seconds(11),
        absl::Hours(25)};
    clock_.Advance(kSteps[in_.Byte() & 3]);
    const int expired = service_->ExpireLapsed();
    Trace("    expired ", expired);
    if (expired > 0) SyncSlots();
  }

  void KeepAliveOp() {
    SessionState* s;
    v1::KeepAliveRequest request;
    request.set_session_id(PickSessionId(&s));
    Check("KeepAlive", service_->KeepAlive(request));
  }

  // An operator, or (bit 7 of `b`) a client, which operator RPCs refuse.
  static const Caller& As(uint8_t b) {
    return (b & 0x80) != 0 ? Service::Client() : Service::Operator();
  }

  void InspectOp() {
    const uint8_t b = in_.Byte();
    switch ((b & 7) % 5) {
      case 0:
        Check("Stats", service_->Stats());
        break;
      case 1: {
        v1::DumpTreeRequest request;
        request.set_all_namespaces((b & 8) != 0);
        request.set_namespace_((b & 16) != 0 ? "a" : "");
        request.set_prefix(ReadTokens(in_).Packed());
        request.set_max_depth(static_cast<int32_t>(in_.Count()));
        request.set_limit(in_.Count());
        Check("DumpTree", service_->DumpTree(As(b), request));
        break;
      }
      case 2: {
        v1::InspectNodeRequest request;
        request.set_node(PickNode());
        Check("InspectNode", service_->InspectNode(As(b), request));
        break;
      }
      case 3: {
        v1::ListSessionsResponse response;
        Check("ListSessions", service_->ListSessions(As(b), &response));
        break;
      }
      default:
        Check("GetLayout", service_->GetLayout());
        break;
    }
  }

  // A request as a scheduler makes it: match (maybe locking), allocate the
  // rest, prepare a backup, store its layers, insert with the backup id,
  // unlock. Each flag bit deviates from the script at one place.
  void RequestOp() {
    SessionState* s;
    int slot;
    const std::string id = PickSessionId(&s, &slot);
    const Tokens tokens = ReadTokens(in_);
    const uint8_t f = in_.Byte();
    const bool lock = (f & 1) != 0;
    std::optional<v1::MatchResult> hit = Match(id, s, {tokens}, lock, false);
    std::vector<LogicalPage> pages;
    NodeId locked = kNoNode;
    int64_t device_len = 0;
    if (hit.has_value()) {
      pages.assign(hit->device().pages().begin(), hit->device().pages().end());
      device_len = hit->device().valid_tokens();
      if (lock && device_len > 0) locked = hit->last_device_node();
    }
    const int64_t need =
        PagesFor(tokens.tokens.size()) - static_cast<int64_t>(pages.size());
    std::vector<LogicalPage> fresh;
    if (need > 0) {
      v1::AllocateRequest request;
      request.set_session_id(id);
      v1::AllocateItem* item = request.add_items();
      item->set_num_pages(need);
      static constexpr int kModes[] = {
          v1::COMPUTE_OWNER_MODE_UNSPECIFIED, v1::COMPUTE_OWNER_MODE_ZIGZAG,
          v1::COMPUTE_OWNER_MODE_ROUND_ROBIN, v1::COMPUTE_OWNER_MODE_ZIGZAG};
      item->set_mode(static_cast<v1::ComputeOwnerMode>(kModes[(f >> 1) & 3]));
      v1::AllocateResponse response;
      const grpc::Status status = service_->Allocate(request, &response);
      Check("Request.Allocate", status);
      if (status.ok() && response.allocations_size() == 1) {
        fresh.assign(response.allocations(0).pages().begin(),
                     response.allocations(0).pages().end());
        for (LogicalPage p : fresh) {
          Remember(pages_, p);
          if (s != nullptr) s->owned.push_back(p);
        }
      }
    }
    uint64_t backup = 0;
    if ((f & 8) != 0 && !fresh.empty()) {
      v1::BackupClientMessage prepare;
      v1::BackupSpec* spec = prepare.mutable_prepare()->add_specs();
      spec->mutable_pages()->Add(fresh.begin(), fresh.end());
      spec->set_logical_tokens(static_cast<int64_t>(tokens.tokens.size()) -
                               device_len);
      std::vector<uint64_t> ids;
      const absl::Status status =
          Backup(slot, id, s, prepare, 0, "Request.prepare", &ids);
      if (status.ok() && ids.size() == 1 && ids[0] != 0 && slot < kSlots) {
        backup = ids[0];
      }
    }
    if (backup != 0) {
      v1::BackupClientMessage message;
      if ((f & 16) != 0) {
        message.mutable_store_all()->set_backup_id(backup);
        (void)Backup(slot, id, s, message, 0, "Request.store_all");
      } else {
        const uint32_t last = (f & 32) != 0 ? steps_ - 1 : steps_;
        for (uint32_t step = 0; step < last; ++step) {
          message.mutable_layer_stored()->clear_backup_ids();
          message.mutable_layer_stored()->add_backup_ids(backup);
          message.mutable_layer_stored()->set_step(step);
          (void)Backup(slot, id, s, message, 0, "Request.layer_stored");
        }
      }
    }
    if ((f & 64) != 0) engine_->WaitForTransfers();
    if ((f & 128) == 0) {
      std::vector<LogicalPage> all = pages;
      all.insert(all.end(), fresh.begin(), fresh.end());
      Insert(id, s, {{tokens, all, false, backup}});
    } else if (!fresh.empty()) {
      if (backup != 0) {
        v1::BackupClientMessage message;
        message.mutable_rollback()->set_backup_id(backup);
        (void)Backup(slot, id, s, message, 0, "Request.rollback");
      }
      v1::FreeRequest request;
      request.set_session_id(id);
      request.mutable_pages()->Add(fresh.begin(), fresh.end());
      const grpc::Status status = service_->Free(request);
      Check("Request.Free", status);
      if (status.ok()) ForgetOwned(s, fresh);
    }
    if (locked != kNoNode) {
      v1::LockRequest request;
      request.set_session_id(id);
      request.add_nodes(locked);
      Check("Request.Unlock", service_->Lock(request, false));
    }
  }

  // --- Final checks ----------------------------------------------------------

  // With no session open and no copy in flight: nothing is held but by the
  // tree, and the host pool holds committed copies only.
  void CheckSettled(absl::string_view when) {
    auto fail = [&](const std::string& what) {
      Fail(absl::StrCat(when, ": ", what), engine_.get());
    };
    if (absl::Status s = engine_->CheckInvariants(); !s.ok()) {
      fail(absl::StrCat("CheckInvariants: ", s.ToString()));
    }
    const SessionManager::Totals totals = sessions_->totals();
    if (totals.sessions != 0 || totals.locks != 0 || totals.pages != 0) {
      fail(absl::StrCat("session totals not zero: sessions=", totals.sessions,
                        " locks=", totals.locks, " pages=", totals.pages));
    }
    const int64_t allocated = engine_->DeviceAllocatedPages();
    const int64_t tree = engine_->TreeDevicePages();
    if (allocated != tree) {
      fail(absl::StrCat(allocated,
                        " device pages allocated but the tree holds ", tree,
                        " (", allocated - tree, " leaked)"));
    }
    const TreeStats stats = engine_->TreeStatistics();
    if (stats.protected_tokens != 0) {
      fail(absl::StrCat(stats.protected_tokens,
                        " device tokens still locked with no session open"));
    }
    if (stats.pending_backups != 0) {
      fail(absl::StrCat(stats.pending_backups,
                        " backups pending with every copy done"));
    }
    std::vector<int64_t> host(cp_, 0);
    int64_t device_pages = 0;
    DumpFilter all;
    for (const NodeInfo& n : engine_->Dump(all)) {
      absl::StatusOr<NodeInfo> info = engine_->Inspect(n.id);
      if (!info.ok()) {
        fail(absl::StrCat("Inspect(", n.id,
                          ") of a dumped node: ", info.status().ToString()));
      }
      if (info->lock_ref != 0) {
        fail(absl::StrCat("node ", n.id, " lock_ref ", info->lock_ref,
                          " with no session open"));
      }
      device_pages += static_cast<int64_t>(info->device_pages.size());
      for (size_t r = 0; r < info->host_pages.size() && r < cp_; ++r) {
        host[r] += static_cast<int64_t>(info->host_pages[r].size());
      }
    }
    if (device_pages != tree) {
      fail(absl::StrCat("nodes hold ", device_pages,
                        " device pages, the tree page set ", tree));
    }
    for (Rank r = 0; r < cp_; ++r) {
      if (engine_->HostUsedPages(r) != host[r]) {
        fail(absl::StrCat("rank ", r, ": ", engine_->HostUsedPages(r),
                          " host pages reserved, committed nodes hold ",
                          host[r]));
      }
    }
  }

  // Unpins every node and evicts everything: both pools must end empty.
  void Drain() {
    const std::vector<int64_t> device(cp_,
                                      engine_->options().device_pages_per_rank);
    const std::vector<int64_t> host(cp_,
                                    engine_->options().host_pages_per_rank);
    for (int round = 0; round < 4; ++round) {
      for (const NodeInfo& n : engine_->Dump(DumpFilter{})) {
        (void)engine_->Pin(n.id, absl::ZeroDuration());
      }
      absl::StatusOr<std::pair<int64_t, int64_t>> freed =
          engine_->EvictPages(device, {});
      if (!freed.ok()) {
        Fail(absl::StrCat("drain: EvictPages(device): ",
                          freed.status().ToString()),
             engine_.get());
      }
      engine_->WaitForTransfers();
      freed = engine_->EvictPages({}, host);
      if (!freed.ok()) {
        Fail(absl::StrCat("drain: EvictPages(host): ",
                          freed.status().ToString()),
             engine_.get());
      }
      engine_->WaitForTransfers();
    }
    CheckSettled("after evicting everything");
    int64_t host_used = 0;
    for (Rank r = 0; r < cp_; ++r) host_used += engine_->HostUsedPages(r);
    const TreeStats stats = engine_->TreeStatistics();
    if (engine_->DeviceAllocatedPages() != 0 || host_used != 0 ||
        stats.nodes != 0) {
      Fail(absl::StrCat(
               "after evicting everything: ", engine_->DeviceAllocatedPages(),
               " device pages allocated, ", host_used, " host pages used, ",
               stats.nodes, " nodes left"),
           engine_.get());
    }
  }

  Input& in_;
  FakeClock clock_{absl::FromUnixSeconds(1000)};
  HeapBackend backend_;
  EventHub hub_;
  service::WatchBroadcaster watch_;
  std::unique_ptr<HiCacheEngine> engine_;
  std::unique_ptr<SessionManager> sessions_;
  Service::Callers callers_;
  std::unique_ptr<service::HiCacheService> rpcs_;
  std::unique_ptr<Service> service_;
  uint32_t cp_ = 1;
  uint32_t steps_ = 1;
  bool settle_each_op_ = false;

  std::optional<SessionState> slots_[kSlots];
  std::vector<std::string> opened_;  // Every session id, open or not.
  std::vector<LogicalPage> pages_;   // Page ids seen in any answer.
  std::vector<NodeId> nodes_;
  std::vector<uint64_t> backups_;
  BackupStream streams_[kSlots + 1];  // Per slot, and a scratch one.
  std::vector<LoadStream> loads_;     // Started and not finished.
};

bool EnvFlag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

}  // namespace
}  // namespace hicache::fuzz

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  using namespace hicache::fuzz;
  g_trace = EnvFlag("HICACHE_FUZZ_TRACE");
  spdlog::set_level(EnvFlag("HICACHE_FUZZ_LOG") ? spdlog::level::info
                                                : spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hicache::fuzz;
  Input in(data, size);
  Run run(in);
  run.Start();
  run.Ops();
  run.Finish();
  return 0;
}
