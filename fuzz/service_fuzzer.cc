// libFuzzer target: drives the in-process daemon -- service::HiCacheService
// for the unary RPCs, and the engine-layer stream classes BackupStream,
// LoadStream and WorkerSubscription (what HiCacheService's stream handlers
// run) for the streaming ones, over a real HiCacheEngine, SessionManager and
// EventHub -- with sequences of RPCs decoded from the input, the way a buggy
// or hostile client would send them, and checks after every input that no
// page leaked or is held twice and that every stream ended.
//
// Input format (see fuzz/corpus/make_seeds.py, which writes the seeds):
//   byte 0  cp_size = 1 + (b & 3); write policy ((b >> 2) & 3) % 3 (through,
//           selective, back); eviction policy (b >> 4) & 1 ? LFU : LRU;
//           but with (b >> 7) & 1 ("extended"): write policy (b >> 2) & 3
//           (through, selective, back, ahead) and eviction policy
//           (b >> 4) & 1 ? TinyLFU : SLRU (ahead + TinyLFU: the daemon's
//           default pair);
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
//           kMaxOps ops ran. New opcodes go at the end of Op, so that the
//           opcode bytes of older inputs keep their meaning.
// Page size is 4 tokens. Tokens come from three base sequences that share
// prefixes (so matches, splits and duplicates happen) or from the input over
// the alphabet {0, 1, 2}.
//
// Streams. HiCacheService's stream handlers need a grpc::ServerContext and a
// ServerReaderWriter / ServerWriter, which cannot be built in process; the
// fuzzer runs what they run -- BackupStream, LoadStream, WorkerSubscription
// (daemon/engine) -- on its own thread, at fixed points of the input:
//   * BackupSession: the client's messages go to BackupStream's Prepare /
//     LayerStored / StoreAll / Rollback; the stream's writer (NextEvent, which
//     blocks) is drained after every op, but only as far as events are there:
//     EventCounter, the engine's listener in front of the hub, counts each
//     operation's backup events, and a stream's mailbox receives exactly
//     those of the operations it prepared. A client that goes away calls
//     EndOfInput, and then NextEvent runs until it ends, with a bound
//     (kHung) past the last copy: an outcome that never comes is a bug.
//   * LoadBack: LoadStream::Start per item, then Next with a deadline (after
//     every op for a "live" stream, as the handler's loop; or when the client
//     reads to the end, or never when it cancels).
//   * Subscribe: WorkerSubscription::Open, Next polled after every op.
//   Only the request checks of the LoadBack handler before its stream opens
//   are repeated here (StartLoadBack; keep it in step with
//   daemon/service/hicache_service_streams.cc).
// Copies: the copy engine sits behind a gate (GatedTransferEngine) that the
// Hold op closes for a few ops, so that calls meeting loads and backups whose
// copies are still in flight is a state an input reaches deterministically.
//
// After every op: engine->CheckInvariants(), and no RPC may answer INTERNAL,
// UNKNOWN or DATA_LOSS. After every input: every stream ends (an outcome the
// stream waits for must arrive, a subscription ends with its session), the hub
// routes no operation any more, every session is closed, copies settle, and
// then: invariants hold, the session totals are zero, every allocated device
// page is the tree's, no node is locked, every reserved host page belongs to a
// committed node, and after unpinning and evicting everything both pools are
// empty. Any violation prints what failed and traps, so libFuzzer reports a
// crash.
//
// Environment: HICACHE_FUZZ_TRACE=1 prints every op and its status (use it on
// a reproducer); HICACHE_FUZZ_LOG=1 keeps the daemon's log.
#include <algorithm>
#include <atomic>
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

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/core/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/backend/cpu/cpu_transfer_engine.h"
#include "daemon/core/clock.h"
#include "daemon/engine/backup_stream.h"
#include "daemon/engine/caller.h"
#include "daemon/engine/event_hub.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/load_stream.h"
#include "daemon/engine/request_flow.h"
#include "daemon/engine/session_manager.h"
#include "daemon/engine/stream_context.h"
#include "daemon/engine/worker_subscription.h"
#include "daemon/pool/kv_pool.h"
#include "daemon/service/caller_resolver.h"
#include "daemon/service/hicache_service.h"
#include "daemon/service/watch_broadcaster.h"
#include "daemon/transfer/faulty_transfer_engine.h"
#include "grpcpp/server_context.h"
#include "hicache/v1/hicache.pb.h"
#include "spdlog/spdlog.h"

namespace hicache::fuzz {
namespace {

constexpr uint32_t kPageSize = 4;
constexpr int kMaxOps = 200;
constexpr int kSlots = 4;
constexpr size_t kMaxKnown = 64;  // Remembered page / node / backup ids.
constexpr size_t kMaxAdmitted = 16;  // Admitted requests kept per session.

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
// Copies held in flight. While closed (the Hold op), submitted copy tasks are
// kept instead of reaching the copy engine, so "copies still in flight" is a
// state an input reaches deterministically (with the settle bit, exactly)
// instead of a race with the transfer workers: the clients' calls then meet
// loads and backups whose copies have not landed. Open() passes them on, in
// order; Drain() (the engine's, at its end) opens first. The fuzzer opens it
// before every wait for the copies (Run::Settle).

class GatedTransferEngine final : public TransferEngine {
 public:
  GatedTransferEngine(TransferListener* listener,
                      const TransferEngineFactory& inner)
      : listener_(listener), inner_(inner(listener)) {}

  absl::Status Submit(TransferTask task) override {
    MutexLock lock(&mu_);
    if (closed_) {
      held_.push_back(std::move(task));
      return absl::OkStatus();
    }
    return inner_->Submit(std::move(task));
  }
  void Drain() override {
    Open();
    inner_->Drain();
  }
  absl::StatusOr<uint64_t> RegisterFence(Rank rank,
                                         const std::string& handle) override {
    return inner_->RegisterFence(rank, handle);
  }
  absl::Status ReleaseFence(uint64_t fence) override {
    return inner_->ReleaseFence(fence);
  }
  absl::StatusOr<Rank> FenceRank(uint64_t fence) const override {
    return inner_->FenceRank(fence);
  }

  void Close() {
    MutexLock lock(&mu_);
    closed_ = true;
  }
  // Passes the held copies on. One the copy engine refuses now (it accepted
  // none of them yet) completes as failed, so that the engine's count of
  // steps in flight still comes down.
  void Open() {
    std::vector<TransferTask> held;
    {
      MutexLock lock(&mu_);
      closed_ = false;
      held.swap(held_);
    }
    for (TransferTask& task : held) {
      const TransferTask copy = task;
      if (absl::Status s = inner_->Submit(std::move(task)); !s.ok()) {
        for (const RankCopy& rank : copy.ranks) {
          StepDone done;
          done.op_id = copy.op_id;
          done.direction = copy.direction;
          done.rank = rank.rank;
          done.step = copy.step;
          done.status = s;
          listener_->OnStepDone(std::move(done));
        }
      }
    }
  }
  bool closed() const {
    MutexLock lock(&mu_);
    return closed_;
  }
  size_t held() const {
    MutexLock lock(&mu_);
    return held_.size();
  }

 private:
  TransferListener* const listener_;
  const std::unique_ptr<TransferEngine> inner_;
  mutable Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<TransferTask> held_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------
// Backup events per operation, counted on their way from the engine to the
// hub (the engine's listener is this counter, which hands every event on to
// the EventHub, as DaemonServer's engine reports to its hub directly). A
// BackupStream's mailbox receives exactly the events of the operations it
// prepared -- those queued in the hub before its claim and those after -- and
// the counter sees each event before the hub delivers it. So when a stream's
// count is above the events its NextEvent returned, one is in the mailbox or
// being put there: NextEvent, which blocks, is called only then, and the
// fuzzer drains every stream on its own thread without ever blocking for good.

class EventCounter final : public EngineListener {
 public:
  explicit EventCounter(EngineListener* next) : next_(next) {}

  void OnBackupStep(uint64_t op, Rank rank, uint32_t step) override {
    Count(op);
    next_->OnBackupStep(op, rank, step);
  }
  void OnBackupCommitted(uint64_t op, NodeId node) override {
    Count(op);
    next_->OnBackupCommitted(op, node);
  }
  void OnBackupRolledBack(uint64_t op) override {
    Count(op);
    next_->OnBackupRolledBack(op);
  }
  void OnLoadStep(uint64_t op, Rank rank, uint32_t step,
                  const std::string& fence) override {
    next_->OnLoadStep(op, rank, step, fence);
  }
  void OnLoadDone(uint64_t op, bool ok) override { next_->OnLoadDone(op, ok); }

  // Backup events of `ops` so far.
  int64_t Events(const std::set<uint64_t>& ops) const {
    MutexLock lock(&mu_);
    return SumLocked(ops);
  }

  // Waits until more than `seen` backup events of `ops` came, or until
  // `deadline`; returns whether they did.
  bool AwaitMore(const std::set<uint64_t>& ops, int64_t seen,
                 absl::Time deadline) const {
    MutexLock lock(&mu_);
    while (SumLocked(ops) <= seen) {
      if (cv_.WaitWithTimeout(&mu_, deadline - absl::Now())) {
        return SumLocked(ops) > seen;
      }
    }
    return true;
  }

 private:
  void Count(uint64_t op) {
    MutexLock lock(&mu_);
    ++counts_[op];
    cv_.SignalAll();
  }
  int64_t SumLocked(const std::set<uint64_t>& ops) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t sum = 0;
    for (uint64_t op : ops) {
      auto it = counts_.find(op);
      if (it != counts_.end()) sum += it->second;
    }
    return sum;
  }

  EngineListener* const next_;
  mutable Mutex mu_;
  mutable CondVar cv_;
  absl::flat_hash_map<uint64_t, int64_t> counts_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------
// The one place that knows how the service is called: each unary RPC with a
// fresh ServerContext, the caller's identity (daemon/engine/caller.h) coming
// from a resolver that Call() sets first. Session RPCs are made as a plain
// client, Evict / SetFreeRoom / DumpTree / InspectNode / ListSessions as an
// operator (or, to check the refusal, as a client). The streams get what
// HiCacheService::StreamContextFor gives them (Context()).

class Service {
 public:
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
    return Call(Client(), &service::HiCacheService::OpenSession, &request,
                response);
  }
  grpc::Status KeepAlive(const v1::KeepAliveRequest& request) {
    v1::KeepAliveResponse response;
    return Call(Client(), &service::HiCacheService::KeepAlive, &request,
                &response);
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
    return Call(Client(), &service::HiCacheService::Allocate, &request,
                response);
  }
  grpc::Status Free(const v1::FreeRequest& request) {
    v1::FreeResponse response;
    return Call(Client(), &service::HiCacheService::Free, &request, &response);
  }
  grpc::Status MatchPrefix(const v1::MatchPrefixRequest& request,
                           v1::MatchPrefixResponse* response) {
    return Call(Client(), &service::HiCacheService::MatchPrefix, &request,
                response);
  }
  grpc::Status Insert(const v1::InsertRequest& request,
                      v1::InsertResponse* response) {
    return Call(Client(), &service::HiCacheService::Insert, &request,
                response);
  }
  // Lock, or Unlock (by nodes or by lock_handles).
  grpc::Status Lock(const v1::LockRequest& request, bool lock,
                    v1::LockResponse* response = nullptr) {
    v1::LockResponse scratch;
    return Call(Client(),
                lock ? &service::HiCacheService::Lock
                     : &service::HiCacheService::Unlock,
                &request, response != nullptr ? response : &scratch);
  }
  grpc::Status Admit(const v1::AdmitRequest& request,
                     v1::AdmitResponse* response) {
    return Call(Client(), &service::HiCacheService::Admit, &request, response);
  }
  grpc::Status Complete(const v1::CompleteRequest& request,
                        v1::CompleteResponse* response) {
    return Call(Client(), &service::HiCacheService::Complete, &request,
                response);
  }
  grpc::Status FinishLoad(const v1::FinishLoadRequest& request) {
    v1::FinishLoadResponse response;
    return Call(Client(), &service::HiCacheService::FinishLoad, &request,
                &response);
  }
  grpc::Status RegisterFence(const v1::RegisterFenceRequest& request,
                             v1::RegisterFenceResponse* response) {
    return Call(Client(), &service::HiCacheService::RegisterFence, &request,
                response);
  }
  grpc::Status ReleaseFence(const v1::ReleaseFenceRequest& request) {
    v1::ReleaseFenceResponse response;
    return Call(Client(), &service::HiCacheService::ReleaseFence, &request,
                &response);
  }
  grpc::Status Pin(const v1::PinRequest& request) {
    v1::PinResponse response;
    return Call(Client(), &service::HiCacheService::Pin, &request, &response);
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
    v1::SetFreeRoomResponse response;
    return Call(as, &service::HiCacheService::SetFreeRoom, &request,
                &response);
  }
  grpc::Status SetQuota(const Caller& as, const v1::SetQuotaRequest& request) {
    v1::SetQuotaResponse response;
    return Call(as, &service::HiCacheService::SetQuota, &request, &response);
  }
  grpc::Status ListQuotas(const Caller& as, v1::ListQuotasResponse* response) {
    return Call(as, &service::HiCacheService::ListQuotas,
                &v1::ListQuotasRequest::default_instance(), response);
  }
  grpc::Status DumpTree(const Caller& as, const v1::DumpTreeRequest& request) {
    v1::DumpTreeResponse response;
    return Call(as, &service::HiCacheService::DumpTree, &request, &response);
  }
  grpc::Status InspectNode(const Caller& as,
                           const v1::InspectNodeRequest& request) {
    v1::NodeInfo response;
    return Call(as, &service::HiCacheService::InspectNode, &request,
                &response);
  }
  grpc::Status ListSessions(const Caller& as,
                            v1::ListSessionsResponse* response) {
    return Call(as, &service::HiCacheService::ListSessions,
                &v1::ListSessionsRequest::default_instance(), response);
  }

  // What HiCacheService::StreamContextFor gives a stream: a mailbox of
  // `backlog` events whose overflow cancels the RPC (here: sets *cancelled).
  StreamContext Context(size_t backlog,
                        std::shared_ptr<std::atomic<bool>> cancelled) const {
    return StreamContext{
        .sessions = sessions_,
        .hub = hub_,
        .engine = engine_,
        .max_backlog = backlog,
        .on_overflow = [cancelled = std::move(cancelled)] {
          cancelled->store(true);
        }};
  }

  // The lease reaper of DaemonServer.
  int ExpireLapsed() { return sessions_->ExpireLapsed(); }

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

  service::HiCacheService* const rpcs_;
  Callers* const callers_;
  SessionManager* const sessions_;
  HiCacheEngine* const engine_;
  EventHub* const hub_;
};

// ---------------------------------------------------------------------------
// The streaming RPCs in flight.

// The service's default mailbox bound (service::StreamLimits).
constexpr size_t kBacklog = 65536;

// How long a stream may wait for an outcome that the engine owes it before
// the fuzzer calls it hung (every copy has completed by then).
constexpr absl::Duration kHung = absl::Seconds(10);

// One BackupSession RPC, as HiCacheService::BackupSession runs it: its
// reader's BackupStream calls and its writer's NextEvent, both here.
struct BackupRpc {
  std::string session;
  std::unique_ptr<BackupStream> stream;  // Null: no RPC.
  std::shared_ptr<std::atomic<bool>> cancelled;  // The mailbox overflowed.
  std::set<uint64_t> prepared;  // Every backup it prepared (and claimed).
  std::set<uint64_t> open;      // Of those, outcome not yet taken.
  int64_t taken = 0;            // Events NextEvent returned.
  bool input_ended = false;     // EndOfInput was called.
  bool writer_done = false;     // NextEvent returned nullopt.
};

// One LoadBack RPC after its `started` messages, while a load is pending.
struct LoadRpc {
  std::string session;
  std::unique_ptr<LoadStream> stream;
  std::shared_ptr<std::atomic<bool>> cancelled;
  // The handler's loop runs after every op; otherwise the stream waits for
  // the client to read to the end or to cancel (a FinishLoad op).
  bool live = false;
  std::set<uint64_t> loads;                  // Started.
  std::vector<LoadStream::Event> done;       // Terminal events taken.
};

// One Subscribe RPC of a worker session.
struct SubscribeRpc {
  std::string session;
  std::string ns;
  Rank rank = 0;
  std::unique_ptr<WorkerSubscription> stream;
  std::shared_ptr<std::atomic<bool>> cancelled;
  int64_t events = 0;
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

// Token counts for reserve_tokens / extend_tokens: mostly small, sometimes an
// edge of the service's range [0, max_tokens_per_request = 2^24] or beyond.
int64_t TokenCount(Input& in) {
  const uint8_t b = in.Byte();
  if (b < 208) return b % 33;
  static constexpr int64_t kEdges[] = {
      -1,
      std::numeric_limits<int64_t>::min(),
      std::numeric_limits<int64_t>::max(),
      int64_t{1} << 24,
      (int64_t{1} << 24) + 1,
      (int64_t{1} << 24) - 1,
      int64_t{1} << 29,
      int64_t{1} << 62,
      4096,
      255,
      256,
      257,
      -4096,
      (int64_t{1} << 31) - 1,
      int64_t{1} << 31,
      2,
  };
  return kEdges[(b - 208) % std::size(kEdges)];
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
  // v1.1 (new opcodes only ever go here, at the end).
  kAdmit,
  kComplete,
  kUnlockHandles,
  kMatchExact,      // MatchPrefix with exact_tail (lock handles kept).
  kLoadBatch,       // LoadBack with items / extend_tokens.
  kFinishLoadRpc,   // The FinishLoad RPC.
  kWorkerStore,     // layer_stored with fences (a worker's rank share).
  kSubscribe,
  kUnsubscribe,
  kFence,           // RegisterFence / ReleaseFence.
  kBackupOpen,      // A BackupSession with a chosen mailbox bound.
  kFlow,            // A whole v1.1 request: Admit, layers, Complete.
  kHold,            // Copies are held in flight for the next few ops.
  kQuota,           // SetQuota (operator or not), then ListQuotas.
  kNumOps,
};

const char* OpName(int op) {
  static constexpr const char* kNames[] = {
      "Open",        "Close",       "Allocate",    "Free",
      "Match",       "Insert",      "Lock",        "Pin",
      "Evict",       "SetFreeRoom", "Prepare",     "LayerStored",
      "StoreAll",    "Rollback",    "StreamEnd",   "LoadBack",
      "FinishLoad",  "Settle",      "Advance",     "KeepAlive",
      "Inspect",     "Request",     "Admit",       "Complete",
      "UnlockHandles", "MatchExact", "LoadBatch",  "FinishLoadRpc",
      "WorkerStore", "Subscribe",   "Unsubscribe", "Fence",
      "BackupOpen",  "Flow",        "Hold",        "Quota"};
  static_assert(std::size(kNames) == kNumOps);
  return kNames[op];
}

// A request that Admit admitted and no Complete finished yet.
struct Admitted {
  std::vector<int32_t> tokens;
  std::vector<LogicalPage> tree;  // Its device hit (the tree's pages).
  std::vector<LogicalPage> own;   // Its new pages.
  std::vector<uint64_t> handles;  // Its locks.
  uint64_t backup = 0;
  int64_t reserve = 0;
  int tries = 0;  // Completes that failed or were deferred.
};

struct SessionState {
  std::string id;
  std::string ns;
  bool worker = false;
  Rank rank = 0;
  // Pages this session allocated and still holds, as far as the fuzzer can
  // tell (inserts that the tree adopted and frees remove them).
  std::vector<LogicalPage> owned;
  // Device pages of its last match (the tree's pages, insertable).
  std::vector<LogicalPage> matched;
  // Lock handles it holds, as far as the fuzzer can tell.
  std::vector<uint64_t> handles;
  std::vector<Admitted> admitted;
};

template <typename T>
void Erase(std::vector<T>& v, const T& value) {
  v.erase(std::remove(v.begin(), v.end(), value), v.end());
}

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
    const bool extended = ((h0 >> 7) & 1) != 0;
    if (extended) {
      // Every write policy, and TinyLFU or SLRU: (3, TinyLFU) is the
      // daemon's default pair.
      options.write_policy = static_cast<WritePolicy>((h0 >> 2) & 3);
      options.eviction_policy = ((h0 >> 4) & 1) != 0 ? EvictionPolicy::kTinyLfu
                                                      : EvictionPolicy::kSlru;
    } else {
      options.write_policy = static_cast<WritePolicy>(((h0 >> 2) & 3) % 3);
      options.eviction_policy =
          ((h0 >> 4) & 1) != 0 ? EvictionPolicy::kLfu : EvictionPolicy::kLru;
    }
    // Write-ahead's rounds inside the calls that make them due:
    // reproducible (the engine's own thread would run them at any time).
    options.write_ahead_thread = false;
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
    // Eviction under write-back waits this long for staged copies (which a
    // closed gate holds) before it evicts without them.
    options.write_back_wait = absl::Milliseconds(100);
    static constexpr double kFaults[] = {0, 0.05, 0.2, 0.5};
    const double fault = kFaults[h1 >> 6];
    // The copy engine: the backend's, maybe behind FaultyTransferEngine,
    // always behind the gate.
    options.wrap_transfer = [this, fault, seed = uint64_t{h0} << 8 | h1](
                                TransferListener* listener,
                                const TransferEngineFactory& backend) {
      TransferEngineFactory inner = backend;
      if (fault > 0) {
        inner = [&backend, fault, seed](TransferListener* faulty_listener) {
          auto faulty =
              std::make_unique<FaultyTransferEngine>(faulty_listener, backend);
          faulty->SetRandom({.seed = seed,
                             .device_to_host = fault,
                             .host_to_device = fault});
          return std::unique_ptr<TransferEngine>(std::move(faulty));
        };
      }
      auto gate = std::make_unique<GatedTransferEngine>(listener, inner);
      gate_ = gate.get();
      return std::unique_ptr<TransferEngine>(std::move(gate));
    };
    Trace("config: cp_size=", options.cp_size,
          " write_policy=", PolicyName(options.write_policy),
          " eviction_policy=", PolicyName(options.eviction_policy),
          " preset=", options.kv_preset,
          " device/rank=", options.device_pages_per_rank,
          " host/rank=", options.host_pages_per_rank,
          " settle_each_op=", settle_each_op_, " faults=", fault,
          " load_back_threshold=", options.load_back_threshold_tokens);
    absl::StatusOr<std::unique_ptr<HiCacheEngine>> engine =
        HiCacheEngine::Create(options);
    if (!engine.ok()) Fail(engine.status().ToString(), nullptr);
    engine_ = *std::move(engine);
    if (gate_ == nullptr) Fail("the engine did not build its copy engine", nullptr);
    engine_->SetListener(&counter_);
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
      if (op != kHold && hold_ops_ > 0 && --hold_ops_ == 0) OpenGate();
      if (settle_each_op_ && !gate_->closed()) engine_->WaitForTransfers();
      PumpStreams();
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
    if (streams_first) EndStreams((b & 2) != 0, /*sessions_closed=*/false);
    for (const std::string& id : opened_) {
      v1::CloseSessionRequest request;
      request.set_session_id(id);
      Check("teardown CloseSession", service_->CloseSession(request));
    }
    if (!streams_first) EndStreams((b & 2) != 0, /*sessions_closed=*/true);
    Settle();
    if (const size_t claimed = hub_.claimed(); claimed != 0) {
      Fail(absl::StrCat("the hub still routes ", claimed,
                        " operations to streams with every stream ended"),
           engine_.get());
    }
    CheckSettled("after closing every session");
    Drain();
  }

  ~Run() {
    // Destroy in dependency order: the streams (they end their sessions'
    // streams and forget their claims), service, sessions, then the engine
    // (which stops its transfer workers) before the hub it reports to.
    if (gate_ != nullptr) gate_->Open();
    for (BackupRpc& rpc : streams_) rpc.stream.reset();
    loads_.clear();
    for (SubscribeRpc& sub : subs_) sub.stream.reset();
    service_.reset();
    rpcs_.reset();
    sessions_.reset();
    engine_.reset();
  }

 private:
  // --- Helpers -------------------------------------------------------------

  // Every copy completes (the held ones are let go first).
  void Settle() {
    OpenGate();
    engine_->WaitForTransfers();
  }
  void OpenGate() {
    if (gate_ == nullptr || !gate_->closed()) return;
    Trace("    gate opens: ", gate_->held(), " copy tasks go");
    hold_ops_ = 0;
    gate_->Open();
  }

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

  // A refused call changes nothing the sessions hold (SessionManager: a
  // request "fails with a clear error and changes nothing", Lock and Allocate
  // are all or nothing, Unlock releases nothing then; Admit: "any other error
  // undoes the whole call"; Complete: "a bad item changes nothing at all").
  // Only the fuzzer's thread changes the sessions' locks and pages.
  void CheckRefusalChangedNothing(absl::string_view what,
                                  const grpc::Status& status,
                                  const SessionManager::Totals& before) {
    if (status.ok()) return;
    const SessionManager::Totals after = sessions_->totals();
    if (after.locks != before.locks || after.pages != before.pages) {
      Fail(absl::StrCat(what, " was refused (", status.error_code(), ": ",
                        status.error_message(),
                        ") yet changed what the sessions hold: locks ",
                        before.locks, " -> ", after.locks, ", pages ",
                        before.pages, " -> ", after.pages),
           engine_.get());
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

  SessionState* StateOf(const std::string& id) {
    for (auto& slot : slots_) {
      if (slot.has_value() && slot->id == id) return &*slot;
    }
    return nullptr;
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

  // One of the session's open stream backups, any known backup, or a bogus
  // id.
  uint64_t PickBackup(SessionState* s) {
    const uint8_t b = in_.Byte();
    if (b < 128 && s != nullptr) {
      for (const BackupRpc& rpc : streams_) {
        if (rpc.stream != nullptr && rpc.session == s->id &&
            !rpc.open.empty()) {
          auto it = rpc.open.begin();
          std::advance(it, b % rpc.open.size());
          return *it;
        }
      }
    }
    if (b < 224 && !backups_.empty()) return backups_[b % backups_.size()];
    return b % 4;
  }

  // One of the last few backups (likely still pending), any known backup
  // (other sessions', Admit's), or a bogus id.
  uint64_t PickAnyBackup() {
    const uint8_t b = in_.Byte();
    if (b < 160 && !backups_.empty()) {
      return backups_[backups_.size() - 1 -
                      b % std::min<size_t>(backups_.size(), 4)];
    }
    if (b < 224 && !backups_.empty()) return backups_[b % backups_.size()];
    return b % 4;
  }

  // One of the session's lock handles, anybody's, or a bogus one.
  uint64_t PickHandle(SessionState* s) {
    const uint8_t b = in_.Byte();
    if (b < 128 && s != nullptr && !s->handles.empty()) {
      return s->handles[b % s->handles.size()];
    }
    if (b < 224 && !handles_.empty()) return handles_[b % handles_.size()];
    return b % 3 == 0 ? 0 : (uint64_t{1} << 63 | b);
  }

  void ForgetOwned(SessionState* s, const std::vector<LogicalPage>& pages) {
    if (s == nullptr) return;
    for (LogicalPage p : pages) Erase(s->owned, p);
  }

  void AddHandle(const std::string& session, uint64_t handle) {
    if (handle == 0) return;
    Remember(handles_, handle);
    if (SessionState* s = StateOf(session); s != nullptr) {
      s->handles.push_back(handle);
    }
  }

  void KeepAdmitted(SessionState* s, Admitted a) {
    if (s == nullptr) return;
    if (s->admitted.size() >= kMaxAdmitted) {
      s->admitted.erase(s->admitted.begin());
    }
    s->admitted.push_back(std::move(a));
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

  // --- BackupSession ----------------------------------------------------------

  // One client message on `rpc` (a new RPC when none runs), as the handler's
  // reader does with it. Returns the status the server streams as `error`
  // (or ends the RPC with); `prepared` receives a prepare's ids. *ended is
  // set when the server ends the RPC after this message.
  absl::Status BackupMessage(BackupRpc& rpc, const v1::BackupClientMessage& in,
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
      Trace("    BackupSession of '", rpc.session, "' opened (backlog ",
            backlog, ")");
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
        Trace("    prepare: pages [", absl::StrJoin(spec.pages(), ","),
              "], ", spec.logical_tokens(), " tokens");
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
  void PumpBackup(BackupRpc& rpc) {
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
  void EndBackup(BackupRpc& rpc, bool broken) {
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

  // --- LoadBack ---------------------------------------------------------------

  // As HiCacheService::LoadBack up to its loop: the request's checks, the
  // stream, each item's Start (an item that fails ends the starts; those
  // started still run). Returns the RPC while a load is pending (else null:
  // the RPC is over) and, in *failed, the status the RPC ends with.
  std::unique_ptr<LoadRpc> StartLoadBack(const v1::LoadBackRequest& request,
                                         size_t backlog, absl::Status* failed,
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
      const std::string& bytes = request.items_size() > 0
                                     ? request.items(i).tokens()
                                     : request.tokens();
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
      absl::StatusOr<LoadResult> load = rpc->stream->Start(
          static_cast<uint32_t>(i), items[i],
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

  void TakeLoadEvent(LoadRpc& rpc, const LoadStream::Event& event) {
    if (!rpc.loads.contains(event.load)) {
      Fail(absl::StrCat("LoadBack of ", rpc.session,
                        " streamed an event of load ", event.load,
                        ", which it never started"),
           engine_.get());
    }
    if (event.kind != LoadStream::Event::Kind::kDone) return;
    Trace("    load ", event.load, " done ok=", event.ok, " handle ",
          event.lock_handle);
    if (event.ok && event.lock_handle == 0) {
      Fail(absl::StrCat("load ", event.load,
                        " reported done with no lock handle"),
           engine_.get());
    }
    AddHandle(rpc.session, event.lock_handle);
    rpc.done.push_back(event);
  }

  // The handler's loop, without waiting. Returns true when the RPC is over.
  bool PumpLoad(LoadRpc& rpc) {
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
  absl::Status FinishLoadRpc(LoadRpc& rpc, bool wait) {
    if (wait) {
      Settle();
      const absl::Time deadline = absl::Now() + kHung;
      while (rpc.stream->pending() && !rpc.cancelled->load()) {
        std::optional<LoadStream::Event> event = rpc.stream->Next(deadline);
        if (!event.has_value()) {
          if (rpc.stream->overflowed()) break;
          Fail(absl::StrCat("LoadBack of ", rpc.session,
                            " never reported loads ",
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

  // --- Subscribe --------------------------------------------------------------

  void TakeWorkerEvent(SubscribeRpc& sub, const OpEvent& event) {
    ++sub.events;
    if (event.rank != sub.rank) {
      Fail(absl::StrCat("the subscription of worker ", sub.session, " (rank ",
                        sub.rank, ") got an event for rank ", event.rank,
                        " (op ", event.op, ")"),
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
  void PumpSubscription(SubscribeRpc& sub) {
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
  void PumpStreams() {
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

  void EndStreams(bool broken, bool sessions_closed) {
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
        Settle();
        return;
      case kAdvanceClock:
        return AdvanceOp();
      case kKeepAlive:
        return KeepAliveOp();
      case kInspect:
        return InspectOp();
      case kRequest:
        return RequestOp();
      case kAdmit:
        return AdmitOp();
      case kComplete:
        return CompleteOp();
      case kUnlockHandles:
        return UnlockHandlesOp();
      case kMatchExact:
        return MatchExactOp();
      case kLoadBatch:
        return LoadBatchOp();
      case kFinishLoadRpc:
        return FinishLoadRpcOp();
      case kWorkerStore:
        return WorkerStoreOp();
      case kSubscribe:
        return SubscribeOp();
      case kUnsubscribe:
        return UnsubscribeOp();
      case kFence:
        return FenceOp();
      case kBackupOpen:
        return BackupOpenOp();
      case kFlow:
        return FlowOp();
      case kHold:
        return HoldOp();
      case kQuota:
        return QuotaOp();
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
    session_ns_[response.session_id()] = request.namespace_();
    // The slot's previous client is done with its stream.
    EndBackup(streams_[slot], /*broken=*/false);
    slots_[slot].emplace();
    slots_[slot]->id = response.session_id();
    slots_[slot]->ns = request.namespace_();
    slots_[slot]->worker = request.role() == v1::ROLE_WORKER;
    slots_[slot]->rank = request.rank();
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
    const SessionManager::Totals before = sessions_->totals();
    const grpc::Status status = service_->Allocate(request, &response);
    Check("Allocate", status);
    CheckRefusalChangedNothing("Allocate", status, before);
    if (!status.ok()) return;
    for (const v1::Locations& list : response.allocations()) {
      for (int64_t p : list.pages()) {
        Remember(pages_, p);
        if (s != nullptr) s->owned.push_back(p);
      }
    }
  }

  // Allocates `n` pages for `id`; empty when refused.
  std::vector<LogicalPage> AllocatePages(const std::string& id,
                                         SessionState* s, int64_t n,
                                         int mode, grpc::Status* status_out) {
    v1::AllocateRequest request;
    request.set_session_id(id);
    v1::AllocateItem* item = request.add_items();
    item->set_num_pages(n);
    item->set_mode(static_cast<v1::ComputeOwnerMode>(mode));
    v1::AllocateResponse response;
    const SessionManager::Totals before = sessions_->totals();
    const grpc::Status status = service_->Allocate(request, &response);
    Check("Allocate", status);
    CheckRefusalChangedNothing("Allocate", status, before);
    if (status_out != nullptr) *status_out = status;
    std::vector<LogicalPage> fresh;
    if (status.ok() && response.allocations_size() == 1) {
      fresh.assign(response.allocations(0).pages().begin(),
                   response.allocations(0).pages().end());
      for (LogicalPage p : fresh) {
        Remember(pages_, p);
        if (s != nullptr) s->owned.push_back(p);
      }
    }
    return fresh;
  }

  void FreeOp() {
    SessionState* s;
    v1::FreeRequest request;
    request.set_session_id(PickSessionId(&s));
    std::vector<LogicalPage> pages = PickPages(s, in_.Below(5));
    request.mutable_pages()->Add(pages.begin(), pages.end());
    const SessionManager::Totals before = sessions_->totals();
    const grpc::Status status = service_->Free(request);
    Check("Free", status);
    CheckRefusalChangedNothing("Free", status, before);
    if (status.ok()) ForgetOwned(s, pages);
  }

  // Returns the first result (empty when the call failed). Lock handles
  // become the session's.
  std::optional<v1::MatchResult> Match(const std::string& id, SessionState* s,
                                       const std::vector<Tokens>& items,
                                       bool lock, bool peek,
                                       bool exact_tail = false) {
    v1::MatchPrefixRequest request;
    request.set_session_id(id);
    request.set_lock(lock);
    request.set_peek(peek);
    request.set_exact_tail(exact_tail);
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
      if (!lock && r.lock_handle() != 0) {
        Fail(absl::StrCat("MatchPrefix without lock answered lock handle ",
                          r.lock_handle()),
             engine_.get());
      }
      AddHandle(id, r.lock_handle());
    }
    const v1::MatchResult& first = response.results(0);
    Trace("    match: device ", first.device().valid_tokens(), " tokens (node ",
          first.last_device_node(), "), host ", first.host_hit_tokens(),
          " (node ", first.last_host_node(), "), handle ", first.lock_handle(),
          " tail_blocked=", first.tail_blocked());
    if (s != nullptr) {
      const auto& pages = first.device().pages();
      s->matched.assign(pages.begin(), pages.end());
    }
    return first;
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

  // MatchPrefix with exact_tail (a sub-page tail hit is not floored), lock
  // and peek from the flags.
  void MatchExactOp() {
    SessionState* s;
    const std::string id = PickSessionId(&s);
    const uint8_t b = in_.Byte();
    std::vector<Tokens> items;
    const size_t n = 1 + (b & 1);
    for (size_t i = 0; i < n; ++i) items.push_back(ReadTokens(in_));
    Match(id, s, items, (b & 2) != 0, (b & 4) != 0, (b & 8) == 0);
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

  // As SessionManager does: pages the tree adopted or freed leave the
  // session; uncached ones stay.
  void Inserted(SessionState* s, const std::vector<LogicalPage>& pages,
                const v1::InsertResult& r) {
    Trace("    inserted: node ", r.node(), " present ", r.present_tokens(),
          " cached ", r.cached_tokens(), " deferred=", r.deferred(),
          " duplicates ", r.duplicate_pages_size(), " uncached ",
          r.uncached_pages_size(), " backup_attached=", r.backup_attached());
    if (r.node() != kNoNode) Remember(nodes_, r.node());
    for (int64_t p : r.duplicate_pages()) Remember(pages_, p);
    for (int64_t p : r.uncached_pages()) Remember(pages_, p);
    if (s == nullptr || r.deferred()) return;
    absl::flat_hash_set<LogicalPage> uncached(r.uncached_pages().begin(),
                                              r.uncached_pages().end());
    std::vector<LogicalPage> gone;
    for (LogicalPage p : pages) {
      if (!uncached.contains(p)) gone.push_back(p);
    }
    ForgetOwned(s, gone);
  }

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
      if (i < static_cast<int>(items.size())) {
        Inserted(s, items[i].pages, response.results(i));
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
    const std::string id = PickSessionId(&s);
    request.set_session_id(id);
    const uint8_t b = in_.Byte();
    const size_t n = 1 + (b & 3);
    for (size_t i = 0; i < n; ++i) request.add_nodes(PickNode());
    v1::LockResponse response;
    const SessionManager::Totals before = sessions_->totals();
    const grpc::Status status = service_->Lock(request, (b & 4) == 0, &response);
    Check((b & 4) != 0 ? "Unlock" : "Lock", status);
    CheckRefusalChangedNothing((b & 4) != 0 ? "Unlock" : "Lock", status,
                               before);
    if (status.ok()) {
      for (uint64_t h : response.lock_handles()) AddHandle(id, h);
    }
  }

  // Unlock by lock_handles: own, foreign, repeated, bogus; sometimes with
  // nodes too, or sent to Lock (both refused).
  void UnlockHandlesOp() {
    SessionState* s;
    const std::string id = PickSessionId(&s);
    const uint8_t b = in_.Byte();
    v1::LockRequest request;
    request.set_session_id(id);
    const size_t n = 1 + (b & 3);
    for (size_t i = 0; i < n; ++i) request.add_lock_handles(PickHandle(s));
    if ((b & 4) != 0) request.add_nodes(PickNode());
    const bool lock = (b & 8) != 0;
    const SessionManager::Totals before = sessions_->totals();
    const grpc::Status status = service_->Lock(request, lock);
    Check(lock ? "Lock(lock_handles)" : "Unlock(lock_handles)", status);
    CheckRefusalChangedNothing("Unlock(lock_handles)", status, before);
    if (lock && status.ok()) {
      Fail("Lock with lock_handles was accepted", engine_.get());
    }
    if (status.ok() && s != nullptr) {
      for (uint64_t h : request.lock_handles()) Erase(s->handles, h);
    }
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

  // A namespace quota: set (a client is refused), then read back. A refused
  // quota changes nothing; an accepted one is what the listing says. Small
  // counts (`b` bit 4) make limits and guarantees bite within the fuzzer's
  // pools.
  void QuotaOp() {
    const uint8_t b = in_.Byte();
    static constexpr const char* kNamespaces[] = {"", "a", "b", "c"};
    const bool client = (b & 0xC0) == 0xC0;
    v1::SetQuotaRequest request;
    v1::NamespaceQuota* q = request.mutable_quota();
    q->set_namespace_(kNamespaces[b & 3]);
    auto count = [&]() -> int64_t {
      return (b & 0x10) != 0 ? in_.Byte() % 24 : in_.Count();
    };
    if ((b & 0x04) != 0) q->set_device_limit_pages(count());
    if ((b & 0x08) != 0) q->set_device_guaranteed_pages(count());
    if ((b & 0x20) != 0) q->set_host_limit_pages(count());
    if ((b & 0x40) != 0 && !client) q->set_host_guaranteed_pages(count());
    v1::ListQuotasResponse before;
    Check("ListQuotas", service_->ListQuotas(Service::Operator(), &before));
    const grpc::Status set = service_->SetQuota(
        client ? Service::Client() : Service::Operator(), request);
    Check("SetQuota", set);
    if (client && set.error_code() != grpc::StatusCode::PERMISSION_DENIED) {
      Fail(absl::StrCat("a client's SetQuota answered ", set.error_code()),
           engine_.get());
    }
    v1::ListQuotasResponse after;
    Check("ListQuotas", service_->ListQuotas(Service::Operator(), &after));
    auto quota_of = [](const v1::ListQuotasResponse& list,
                       const std::string& ns) {
      for (const v1::NamespaceQuotaUsage& u : list.namespaces()) {
        if (u.quota().namespace_() == ns) return u.quota().SerializeAsString();
      }
      v1::NamespaceQuota none;
      none.set_namespace_(ns);
      return none.SerializeAsString();
    };
    const std::string& ns = q->namespace_();
    const std::string expected =
        set.ok() ? request.quota().SerializeAsString() : quota_of(before, ns);
    if (quota_of(after, ns) != expected) {
      Fail(absl::StrCat("SetQuota of '", ns, "' answered ", set.error_code(),
                        " but ListQuotas lists another quota"),
           engine_.get());
    }
  }

  // BackupSession messages. Each session slot has one stream (streams_); a
  // message for an id that is no open slot goes on a scratch stream.
  // `b` bit 6 puts another session's id on the message (the server ends
  // the stream), bit 7 leaves the id out (allowed after the first).
  BackupRpc& StreamFor(int slot, const std::string& id, uint8_t b,
                       v1::BackupClientMessage* message) {
    BackupRpc& rpc = streams_[std::min(slot, kSlots)];
    message->set_session_id(id);
    if (rpc.stream != nullptr && (b & 0x80) != 0) message->clear_session_id();
    if ((b & 0x40) != 0 && !opened_.empty()) {
      message->set_session_id(opened_[b % opened_.size()]);
    }
    return rpc;
  }

  absl::Status Backup(int slot, const std::string& id, SessionState* s,
                      v1::BackupClientMessage& message, uint8_t b,
                      absl::string_view what,
                      std::vector<uint64_t>* prepared = nullptr,
                      size_t backlog = kBacklog) {
    BackupRpc& rpc = StreamFor(slot, id, b, &message);
    std::vector<uint64_t> ids;
    bool ended = false;
    const absl::Status status =
        BackupMessage(rpc, message, backlog, &ids, &ended);
    Check(what, status);
    for (uint64_t backup : ids) {
      Trace("    prepared backup ", backup);
      if (backup != 0) Remember(backups_, backup);
    }
    if (prepared != nullptr) *prepared = ids;
    if (ended || slot >= kSlots) {
      Trace("    stream ends");
      EndBackup(rpc, /*broken=*/true);
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

  // layer_stored as a worker sends it for its rank (any session may, on its
  // own stream): backups of its namespace's schedulers (Admit's too), other
  // namespaces' and bogus ones, with fences of its rank, another rank, too
  // many, or none. No fence exists on this backend (RegisterFence refuses).
  void WorkerStoreOp() {
    SessionState* s;
    int slot;
    const std::string id = PickSessionId(&s, &slot);
    const uint8_t flags = in_.Byte();
    v1::BackupClientMessage message;
    v1::BackupClientMessage::LayerStored* stored =
        message.mutable_layer_stored();
    const size_t n = 1 + (flags & 1);
    for (size_t i = 0; i < n; ++i) stored->add_backup_ids(PickAnyBackup());
    stored->set_step(in_.Below(steps_ + 2));
    const Rank own = s != nullptr ? s->rank : 0;
    switch ((flags >> 1) & 3) {
      case 0:
        break;
      case 1: {
        v1::RankFence* fence = stored->add_fences();
        fence->set_rank(own);
        fence->set_fence_id(in_.Byte() % 4);
        break;
      }
      case 2:
        for (Rank r = 0; r <= cp_; ++r) {
          v1::RankFence* fence = stored->add_fences();
          fence->set_rank(r);
          fence->set_fence_id(r + 1);
        }
        break;
      default: {
        v1::RankFence* fence = stored->add_fences();
        fence->set_rank((own + 1) % (cp_ + 1));
        fence->set_fence_id(1);
        break;
      }
    }
    const absl::Status status =
        Backup(slot, id, s, message, flags & 0xC0, "Backup.layer_stored(worker)");
    if (status.ok() && stored->fences_size() > 0) {
      Fail("layer_stored named a fence, yet no fence can exist on this "
           "backend",
           engine_.get());
    }
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

  // A BackupSession whose first message carries only the session id (the
  // server answers "empty message" and goes on) and whose mailbox holds
  // {65536, 1, 2, 8} events: small bounds overflow, which cancels the RPC.
  void BackupOpenOp() {
    SessionState* s;
    int slot;
    const std::string id = PickSessionId(&s, &slot);
    const uint8_t b = in_.Byte();
    static constexpr size_t kBacklogs[] = {kBacklog, 1, 2, 8};
    v1::BackupClientMessage message;
    (void)Backup(slot, id, s, message, b & 0xC0, "Backup.open", nullptr,
                 kBacklogs[b & 3]);
  }

  // The client half-closes its stream (bit 0: the stream breaks instead).
  void StreamEndOp() {
    const uint8_t b = in_.Byte();
    EndBackup(streams_[(b >> 1) % kSlots], (b & 1) != 0);
  }

  void LoadBackOp() {
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
  void LoadBatchOp() {
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
  void FinishLoadOp() {
    const uint8_t b = in_.Byte();
    if (loads_.empty()) return;
    const size_t i = (b >> 1) % loads_.size();
    std::unique_ptr<LoadRpc> load = std::move(loads_[i]);
    loads_.erase(loads_.begin() + static_cast<ptrdiff_t>(i));
    Check("LoadBack.finish", FinishLoadRpc(*load, (b & 1) != 0));
  }

  // The FinishLoad RPC: a load of this session (maybe still streaming),
  // another session's, an unknown one.
  void FinishLoadRpcOp() {
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
  void SubscribeOp() {
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

  void UnsubscribeOp() {
    SubscribeRpc& sub = subs_[in_.Byte() % (kSlots + 1)];
    if (sub.stream != nullptr) Trace("    Subscribe of '", sub.session, "' cancelled");
    sub.stream.reset();
  }

  // RegisterFence (any rank, handles of 64 bytes or not) -- refused on this
  // backend, which has no events -- and ReleaseFence of ids never issued.
  void FenceOp() {
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
        Fail(absl::StrCat("RegisterFence answered fence ",
                          response.fence_id(),
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

  // Copies submitted from now on are held (not even started) for the next
  // 1-8 ops, or until something waits for the copies; with bit 4 the held
  // ones go now instead.
  void HoldOp() {
    const uint8_t b = in_.Byte();
    if ((b & 0x10) != 0) {
      OpenGate();
      return;
    }
    hold_ops_ = 1 + (b & 7);
    gate_->Close();
    Trace("    copies held for ", hold_ops_, " ops");
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

  // --- Admit / Complete ---------------------------------------------------------

  static constexpr int kModes[] = {v1::COMPUTE_OWNER_MODE_UNSPECIFIED,
                                   v1::COMPUTE_OWNER_MODE_ZIGZAG,
                                   v1::COMPUTE_OWNER_MODE_ROUND_ROBIN, 77};
  static constexpr int kChoices[] = {v1::BACKUP_CHOICE_AUTO,
                                     v1::BACKUP_CHOICE_NEVER,
                                     v1::BACKUP_CHOICE_ALWAYS, 99};

  // Admit and what its answer must look like: one result per item; first
  // come, first served (after an item that is not admitted none is, and it
  // holds nothing); an admitted item either loads (its host hit reaches the
  // threshold; nothing allocated, no backup) or holds exactly
  // ceil((tokens + reserve) / P) pages with its device hit; no backup when
  // the item said never. The admitted items are kept for Complete.
  std::optional<v1::AdmitResponse> Admit(const std::string& id,
                                         SessionState* s,
                                         const v1::AdmitRequest& request) {
    v1::AdmitResponse response;
    const SessionManager::Totals before = sessions_->totals();
    const grpc::Status status = service_->Admit(request, &response);
    Check("Admit", status);
    CheckRefusalChangedNothing("Admit", status, before);
    if (!status.ok()) return std::nullopt;
    auto fail = [&](const std::string& what) {
      Fail(absl::StrCat("Admit: ", what), engine_.get());
    };
    if (response.results_size() != request.items_size()) {
      fail(absl::StrCat(response.results_size(), " results for ",
                        request.items_size(), " items"));
    }
    const int64_t threshold = std::max<int64_t>(
        1, engine_->options().load_back_threshold_tokens);
    auto item_tokens = [&](int i) {
      return request.items(i).tokens().size() / 4;
    };
    bool refused = false;
    int admitted = 0;
    for (int i = 0; i < response.results_size(); ++i) {
      const v1::AdmitResult& r = response.results(i);
      const v1::AdmitItem& item = request.items(i);
      if (!r.admitted()) {
        refused = true;
        if (r.lock_handle() != 0 || r.pages_size() != 0 ||
            r.backup_id() != 0 || r.device().pages_size() != 0) {
          fail(absl::StrCat("item ", i, " is not admitted but holds something"));
        }
        continue;
      }
      ++admitted;
      Trace("    item ", i, ": ", item_tokens(i), " tokens + ",
            request.items(i).reserve_tokens(), " reserve: hit ",
            r.device().valid_tokens(), " host hit ", r.host_hit_tokens(),
            " load=", r.load(), " new pages [", absl::StrJoin(r.pages(), ","),
            "] backup ", r.backup_id(), " handle ", r.lock_handle(),
            " tail_blocked=", r.tail_blocked());
      if (refused) {
        fail(absl::StrCat("item ", i, " is admitted after an earlier one "
                          "was not (first come, first served)"));
      }
      for (int64_t p : r.device().pages()) Remember(pages_, p);
      for (int64_t p : r.pages()) Remember(pages_, p);
      if (r.last_device_node() != kNoNode) Remember(nodes_, r.last_device_node());
      if (r.last_host_node() != kNoNode) Remember(nodes_, r.last_host_node());
      AddHandle(id, r.lock_handle());
      if (r.backup_id() != 0) {
        Remember(backups_, r.backup_id());
        if (auto ns = session_ns_.find(id); ns != session_ns_.end()) {
          op_ns_[r.backup_id()] = ns->second;
        }
      }
      if (s != nullptr) {
        for (int64_t p : r.pages()) s->owned.push_back(p);
      }
      const int64_t tokens = static_cast<int64_t>(item.tokens().size() / 4);
      if (r.load() != (r.host_hit_tokens() >= threshold)) {
        fail(absl::StrCat("item ", i, ": load=", r.load(), " with a host hit of ",
                          r.host_hit_tokens(), " tokens (threshold ",
                          threshold, ")"));
      }
      if (r.load()) {
        if (r.pages_size() != 0 || r.backup_id() != 0) {
          fail(absl::StrCat("item ", i, " loads, yet got pages or a backup"));
        }
      } else {
        const int64_t want = PagesFor(static_cast<size_t>(
            tokens + item.reserve_tokens()));
        const int64_t got = r.device().pages_size() + r.pages_size();
        if (got != want) {
          fail(absl::StrCat("item ", i, " of ", tokens, " tokens + ",
                            item.reserve_tokens(), " reserve holds ", got,
                            " pages (", r.device().pages_size(),
                            " hit), not ", want));
        }
      }
      if (item.backup() == v1::BACKUP_CHOICE_NEVER && r.backup_id() != 0) {
        fail(absl::StrCat("item ", i, " said never back up, got backup ",
                          r.backup_id()));
      }
      Admitted a;
      const std::string& bytes = item.tokens();
      a.tokens.resize(bytes.size() / 4);
      if (!bytes.empty()) std::memcpy(a.tokens.data(), bytes.data(), bytes.size());
      a.tree.assign(r.device().pages().begin(), r.device().pages().end());
      a.own.assign(r.pages().begin(), r.pages().end());
      if (r.lock_handle() != 0) a.handles.push_back(r.lock_handle());
      a.backup = r.backup_id();
      a.reserve = item.reserve_tokens();
      KeepAdmitted(s, std::move(a));
    }
    Trace("    admitted ", admitted, " of ", response.results_size());
    return response;
  }

  // Admit: 1-4 items, or (bit 7) 8-40 items that share a prefix (the pool
  // runs out: first come, first served), reserve_tokens small or at the
  // edges, every mode and backup choice (also unknown ones).
  void AdmitOp() {
    SessionState* s;
    const std::string id = PickSessionId(&s);
    const uint8_t b = in_.Byte();
    v1::AdmitRequest request;
    request.set_session_id(id);
    if ((b & 0x80) != 0) {
      const size_t n = 8 + in_.Below(33);
      const Tokens base = ReadTokens(in_);
      const int64_t reserve = TokenCount(in_);
      const uint8_t m = in_.Byte();
      for (size_t i = 0; i < n; ++i) {
        Tokens t = base;
        if (!t.tokens.empty()) t.tokens.back() = 200 + static_cast<int32_t>(i);
        v1::AdmitItem* item = request.add_items();
        item->set_tokens(t.Packed());
        item->set_reserve_tokens(reserve);
        item->set_mode(static_cast<v1::ComputeOwnerMode>(kModes[m & 3]));
        item->set_backup(static_cast<v1::BackupChoice>(kChoices[(m >> 2) & 3]));
      }
    } else {
      const size_t n = 1 + (b & 3);
      for (size_t i = 0; i < n; ++i) {
        v1::AdmitItem* item = request.add_items();
        item->set_tokens(ReadTokens(in_).Packed());
        item->set_reserve_tokens(TokenCount(in_));
        const uint8_t m = in_.Byte();
        item->set_mode(static_cast<v1::ComputeOwnerMode>(kModes[m & 3]));
        item->set_backup(static_cast<v1::BackupChoice>(kChoices[(m >> 2) & 3]));
      }
    }
    Admit(id, s, request);
  }

  struct CompleteSource {
    int admitted = -1;  // Index in the session's admitted requests, or -1.
    std::vector<LogicalPage> insert;
    std::vector<LogicalPage> free;
    std::vector<uint64_t> handles;
    bool free_uncached = true;
  };

  // Complete: items from the session's admitted requests -- the insert of
  // the input (and some output) with the hit and new pages, the request's
  // handles, free_uncached and the unused reserve as free_pages -- each
  // deviating at one place: a foreign or repeated handle, a free page the
  // item also inserts, unfinished, no or another backup; or items made up
  // from anything. A deferred item stays admitted for a retry.
  void CompleteOp() {
    SessionState* s;
    const std::string id = PickSessionId(&s);
    const uint8_t b = in_.Byte();
    v1::CompleteRequest request;
    request.set_session_id(id);
    std::vector<CompleteSource> sources;
    const size_t n = 1 + (b & 1);
    for (size_t i = 0; i < n; ++i) {
      const uint8_t d = in_.Byte();
      const uint8_t src = in_.Byte();
      CompleteSource source;
      v1::CompleteItem* item = request.add_items();
      if (s != nullptr && !s->admitted.empty() && src < 224) {
        source.admitted = static_cast<int>(src % s->admitted.size());
        const Admitted& a = s->admitted[source.admitted];
        std::vector<int32_t> tokens = a.tokens;
        if ((d & 0x80) != 0 && a.reserve > 0) {
          const size_t out = in_.Below(
              static_cast<size_t>(std::min<int64_t>(a.reserve, 16)) + 1);
          for (size_t j = 0; j < out; ++j) {
            tokens.push_back(90 + static_cast<int32_t>(j % 3));
          }
        }
        std::vector<LogicalPage> all = a.tree;
        all.insert(all.end(), a.own.begin(), a.own.end());
        const size_t keep =
            std::min<size_t>(all.size(), PagesFor(tokens.size()));
        source.insert.assign(all.begin(), all.begin() + keep);
        source.free.assign(all.begin() + keep, all.end());
        source.handles = a.handles;
        item->set_tokens(Pack(tokens));
        item->set_backup_id(a.backup);
      } else {
        const Tokens tokens = ReadTokens(in_);
        item->set_tokens(tokens.Packed());
        source.insert = InsertPages(s, tokens.tokens.size());
        source.handles.push_back(PickHandle(s));
        source.free = PickPages(s, in_.Below(3));
        if ((d & 0x40) != 0) item->set_backup_id(PickBackup(s));
      }
      source.free_uncached = (d & 1) == 0;
      switch ((d >> 1) & 7) {
        case 3:
          source.handles.push_back(PickHandle(nullptr));
          break;
        case 4:
          source.handles.push_back(source.handles.empty() ? PickHandle(s)
                                                          : source.handles[0]);
          break;
        case 5:
          if (!source.insert.empty()) {
            source.free.push_back(
                source.insert[in_.Below(source.insert.size())]);
          }
          break;
        case 6:
          item->set_unfinished(true);
          break;
        case 7:
          item->set_backup_id((d & 0x40) != 0 ? 0 : PickBackup(s));
          break;
        default:
          break;
      }
      item->mutable_pages()->Add(source.insert.begin(), source.insert.end());
      item->mutable_lock_handles()->Add(source.handles.begin(),
                                        source.handles.end());
      item->set_free_uncached(source.free_uncached);
      item->mutable_free_pages()->Add(source.free.begin(), source.free.end());
      sources.push_back(std::move(source));
    }
    Complete(id, s, request, sources);
  }

  // Sends Complete and keeps the fuzzer's view of the session in step.
  // Returns the results (nullopt when refused).
  std::optional<v1::CompleteResponse> Complete(
      const std::string& id, SessionState* s, const v1::CompleteRequest& request,
      const std::vector<CompleteSource>& sources) {
    for (int i = 0; i < request.items_size(); ++i) {
      const v1::CompleteItem& item = request.items(i);
      Trace("    item ", i, ": ", item.tokens().size() / 4, " tokens, pages [",
            absl::StrJoin(item.pages(), ","), "], backup ", item.backup_id(),
            ", handles [", absl::StrJoin(item.lock_handles(), ","),
            "], free_pages [", absl::StrJoin(item.free_pages(), ","),
            "], free_uncached=", item.free_uncached(),
            " unfinished=", item.unfinished());
    }
    v1::CompleteResponse response;
    const SessionManager::Totals before = sessions_->totals();
    const grpc::Status status = service_->Complete(request, &response);
    Check("Complete", status);
    CheckRefusalChangedNothing("Complete", status, before);
    std::set<int> done;  // Admitted requests that are over.
    if (!status.ok()) {
      for (const CompleteSource& source : sources) {
        if (s == nullptr || source.admitted < 0) continue;
        if (++s->admitted[source.admitted].tries > 3) done.insert(source.admitted);
      }
    } else {
      if (response.results_size() != request.items_size()) {
        Fail(absl::StrCat("Complete: ", response.results_size(),
                          " results for ", request.items_size(), " items"),
             engine_.get());
      }
      for (int i = 0; i < response.results_size(); ++i) {
        const v1::InsertResult& r = response.results(i);
        const CompleteSource& source = sources[i];
        Trace("    item ", i, ": deferred=", r.deferred(), " node ", r.node(),
              " backup_attached=", r.backup_attached(), " uncached ",
              r.uncached_pages_size());
        Inserted(s, source.insert, r);
        if (r.deferred()) {
          if (s != nullptr && source.admitted >= 0) {
            ++s->admitted[source.admitted].tries;  // Retried later.
          }
          continue;
        }
        if (source.free_uncached) {
          ForgetOwned(s, std::vector<LogicalPage>(r.uncached_pages().begin(),
                                                  r.uncached_pages().end()));
        }
        ForgetOwned(s, source.free);
        if (s != nullptr) {
          for (uint64_t h : source.handles) Erase(s->handles, h);
        }
        if (source.admitted >= 0) done.insert(source.admitted);
      }
    }
    if (s != nullptr) {
      for (auto it = done.rbegin(); it != done.rend(); ++it) {
        s->admitted.erase(s->admitted.begin() + *it);
      }
    }
    if (!status.ok()) return std::nullopt;
    return response;
  }

  // A request as a v1.1 scheduler makes it (hicache-replay): Admit; on a
  // host hit LoadBack with extend_tokens, read to the end, then Allocate the
  // rest; the layers of its backup stored by the scheduler or by the
  // namespace's workers on their own streams; Complete with its handles,
  // free_uncached and the reserve as free_pages. A deferred Complete stays
  // admitted (a later Complete op retries it). Flags:
  //   bits 0-1 backup {auto, never, always, always}; bit 2 zigzag lanes;
  //   bit 3 workers store the layers; bit 4 the last step is not stored;
  //   bit 5 settle before Complete; bit 6 no Complete now (left admitted);
  //   bit 7 give up instead: roll back, free the pages, unlock.
  void FlowOp() {
    SessionState* s;
    int slot;
    const std::string id = PickSessionId(&s, &slot);
    const Tokens tokens = ReadTokens(in_);
    const int64_t reserve = in_.Byte() % 13;
    const uint8_t f = in_.Byte();
    const int choice = kChoices[std::min(f & 3, 2)];
    const int mode = (f & 4) != 0 ? v1::COMPUTE_OWNER_MODE_ZIGZAG
                                  : v1::COMPUTE_OWNER_MODE_UNSPECIFIED;
    v1::AdmitRequest admit;
    admit.set_session_id(id);
    v1::AdmitItem* item = admit.add_items();
    item->set_tokens(tokens.Packed());
    item->set_reserve_tokens(reserve);
    item->set_mode(static_cast<v1::ComputeOwnerMode>(mode));
    item->set_backup(static_cast<v1::BackupChoice>(choice));
    std::optional<v1::AdmitResponse> admitted = Admit(id, s, admit);
    if (!admitted.has_value() || admitted->results_size() != 1 ||
        !admitted->results(0).admitted()) {
      return;
    }
    // Admit() kept it; the flow goes on with it itself.
    Admitted a;
    if (s != nullptr && !s->admitted.empty()) {
      a = s->admitted.back();
      s->admitted.pop_back();
    }
    const v1::AdmitResult& r = admitted->results(0);
    const int64_t n = static_cast<int64_t>(tokens.tokens.size());
    if (r.load()) {
      v1::LoadBackRequest load;
      load.set_session_id(id);
      load.set_tokens(tokens.Packed());
      load.set_extend_tokens(
          std::max<int64_t>(0, n - r.device().valid_tokens() -
                                   r.host_hit_tokens()) +
          reserve);
      absl::Status failed;
      std::vector<LoadResult> started;
      std::unique_ptr<LoadRpc> rpc =
          StartLoadBack(load, kBacklog, &failed, &started);
      Check("Flow.LoadBack", failed);
      bool ok = started.size() == 1;
      int64_t cached = ok ? started[0].device_len : 0;
      if (ok && started[0].lock_handle != 0) {
        a.handles.push_back(started[0].lock_handle);
      }
      if (rpc != nullptr) {
        Check("Flow.LoadBack.finish", FinishLoadRpc(*rpc, /*wait=*/true));
        for (const LoadStream::Event& done : rpc->done) {
          if (done.lock_handle != 0) a.handles.push_back(done.lock_handle);
          if (done.ok) cached += started[0].loaded_len;
        }
      }
      const size_t reuse =
          ok ? std::min<size_t>(started[0].pages.size(), cached / kPageSize)
             : 0;
      a.tree.clear();
      if (ok) {
        a.tree.assign(started[0].pages.begin(),
                      started[0].pages.begin() + reuse);
      }
      const int64_t need = PagesFor(n + reserve) - static_cast<int64_t>(reuse);
      if (need > 0) {
        grpc::Status status;
        a.own = AllocatePages(id, s, need, mode, &status);
        if (!status.ok()) {
          ReleaseFlow(id, s, slot, a);
          return;
        }
      }
      const int64_t new_input = n - static_cast<int64_t>(reuse) * kPageSize;
      const bool backup = choice == v1::BACKUP_CHOICE_ALWAYS ||
                          (choice == v1::BACKUP_CHOICE_AUTO &&
                           engine_->options().write_policy ==
                               WritePolicy::kWriteThrough);
      if (backup && new_input > 0 && !a.own.empty()) {
        v1::BackupClientMessage prepare;
        v1::BackupSpec* spec = prepare.mutable_prepare()->add_specs();
        const size_t pages = std::min<size_t>(a.own.size(), PagesFor(new_input));
        spec->mutable_pages()->Add(a.own.begin(), a.own.begin() + pages);
        spec->set_logical_tokens(new_input);
        std::vector<uint64_t> ids;
        const absl::Status status =
            Backup(slot, id, s, prepare, 0, "Flow.prepare", &ids);
        if (status.ok() && ids.size() == 1 && slot < kSlots) a.backup = ids[0];
      }
    }
    if (a.backup != 0) StoreLayers(id, s, slot, a.backup, f);
    if ((f & 0x20) != 0) Settle();
    if ((f & 0x80) != 0) {
      ReleaseFlow(id, s, slot, a);
      return;
    }
    if ((f & 0x40) != 0) {
      KeepAdmitted(s, std::move(a));
      return;
    }
    CompleteSource source;
    std::vector<LogicalPage> all = a.tree;
    all.insert(all.end(), a.own.begin(), a.own.end());
    const size_t keep = std::min<size_t>(all.size(), PagesFor(n));
    source.insert.assign(all.begin(), all.begin() + keep);
    source.free.assign(all.begin() + keep, all.end());
    source.handles = a.handles;
    v1::CompleteRequest complete;
    complete.set_session_id(id);
    v1::CompleteItem* out = complete.add_items();
    out->set_tokens(tokens.Packed());
    out->mutable_pages()->Add(source.insert.begin(), source.insert.end());
    out->set_backup_id(a.backup);
    out->mutable_lock_handles()->Add(source.handles.begin(),
                                     source.handles.end());
    out->set_free_uncached(true);
    out->mutable_free_pages()->Add(source.free.begin(), source.free.end());
    // Kept first, so that a deferred result leaves it admitted.
    KeepAdmitted(s, std::move(a));
    source.admitted = s != nullptr ? static_cast<int>(s->admitted.size()) - 1 : -1;
    Complete(id, s, complete, {source});
  }

  // The layers of `backup`, step by step: by the scheduler on its stream, or
  // (flag bit 3) by each worker session of its namespace on the worker's
  // stream (each stores its rank's share); bit 4 leaves out the last step.
  void StoreLayers(const std::string& id, SessionState* s, int slot,
                   uint64_t backup, uint8_t f) {
    const uint32_t last = (f & 0x10) != 0 ? steps_ - 1 : steps_;
    std::vector<int> writers;
    if ((f & 0x08) != 0 && s != nullptr) {
      for (int k = 0; k < kSlots; ++k) {
        if (slots_[k].has_value() && slots_[k]->worker &&
            slots_[k]->ns == s->ns) {
          writers.push_back(k);
        }
      }
    }
    for (uint32_t step = 0; step < last; ++step) {
      v1::BackupClientMessage message;
      message.mutable_layer_stored()->add_backup_ids(backup);
      message.mutable_layer_stored()->set_step(step);
      if (writers.empty()) {
        (void)Backup(slot, id, s, message, 0, "Flow.layer_stored");
        continue;
      }
      for (int k : writers) {
        SessionState* worker = &*slots_[k];
        v1::BackupClientMessage copy = message;
        (void)Backup(k, worker->id, worker, copy, 0,
                     "Flow.layer_stored(worker)");
      }
    }
  }

  // Gives a request up: its backup rolled back, its pages freed, its locks
  // released.
  void ReleaseFlow(const std::string& id, SessionState* s, int slot,
                   const Admitted& a) {
    if (a.backup != 0) {
      v1::BackupClientMessage message;
      message.mutable_rollback()->set_backup_id(a.backup);
      (void)Backup(slot, id, s, message, 0, "Flow.rollback");
    }
    if (!a.own.empty()) {
      v1::FreeRequest request;
      request.set_session_id(id);
      request.mutable_pages()->Add(a.own.begin(), a.own.end());
      const grpc::Status status = service_->Free(request);
      Check("Flow.Free", status);
      if (status.ok()) ForgetOwned(s, a.own);
    }
    if (!a.handles.empty()) {
      v1::LockRequest request;
      request.set_session_id(id);
      request.mutable_lock_handles()->Add(a.handles.begin(), a.handles.end());
      const grpc::Status status = service_->Lock(request, false);
      Check("Flow.Unlock", status);
      if (status.ok() && s != nullptr) {
        for (uint64_t h : a.handles) Erase(s->handles, h);
      }
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
    uint64_t handle = 0;
    int64_t device_len = 0;
    if (hit.has_value()) {
      pages.assign(hit->device().pages().begin(), hit->device().pages().end());
      device_len = hit->device().valid_tokens();
      if (lock && device_len > 0) {
        locked = hit->last_device_node();
        handle = hit->lock_handle();
      }
    }
    const int64_t need =
        PagesFor(tokens.tokens.size()) - static_cast<int64_t>(pages.size());
    std::vector<LogicalPage> fresh;
    if (need > 0) {
      static constexpr int kRequestModes[] = {
          v1::COMPUTE_OWNER_MODE_UNSPECIFIED, v1::COMPUTE_OWNER_MODE_ZIGZAG,
          v1::COMPUTE_OWNER_MODE_ROUND_ROBIN, v1::COMPUTE_OWNER_MODE_ZIGZAG};
      fresh = AllocatePages(id, s, need, kRequestModes[(f >> 1) & 3], nullptr);
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
    if ((f & 64) != 0) Settle();
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
      const grpc::Status status = service_->Lock(request, false);
      Check("Request.Unlock", status);
      if (status.ok() && s != nullptr) Erase(s->handles, handle);
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

  // Guarantees hold against operators too (docs/quotas.md): an eviction of
  // everything in one tier leaves each guaranteed namespace at least what
  // it held there or its guarantee, whichever is less. Then the quotas go,
  // as an operator removes them to empty a daemon.
  void CheckGuaranteesThenClear(const std::vector<int64_t>& device,
                                const std::vector<int64_t>& host) {
    for (int tier = 0; tier < 2; ++tier) {
      const std::vector<NamespaceQuotaUsage> before =
          engine_->NamespaceQuotas();
      absl::StatusOr<std::pair<int64_t, int64_t>> freed =
          tier == 0 ? engine_->EvictPages(device, {})
                    : engine_->EvictPages({}, host);
      Check("guarantees: EvictPages", freed.status());
      Settle();
      for (const NamespaceQuotaUsage& was : before) {
        const int64_t floor = tier == 0 ? was.quota.device_guaranteed
                                        : was.quota.host_guaranteed;
        const int64_t held =
            tier == 0 ? was.device_cached_pages : was.host_pages;
        for (const NamespaceQuotaUsage& now : engine_->NamespaceQuotas()) {
          if (now.quota.ns != was.quota.ns) continue;
          const int64_t kept =
              tier == 0 ? now.device_cached_pages : now.host_pages;
          if (kept < std::min(held, floor)) {
            Fail(absl::StrCat("an operator eviction took namespace '",
                              was.quota.ns, "' from ", held, " to ", kept,
                              tier == 0 ? " device" : " host",
                              " pages, below its guarantee of ", floor),
                 engine_.get());
          }
        }
      }
    }
    for (const NamespaceQuotaUsage& usage : engine_->NamespaceQuotas()) {
      if (usage.quota.empty()) continue;
      Check("clear quota", engine_->SetNamespaceQuota({.ns = usage.quota.ns}));
    }
  }

  // Unpins every node and evicts everything: both pools must end empty.
  void Drain() {
    const std::vector<int64_t> device(cp_,
                                      engine_->options().device_pages_per_rank);
    const std::vector<int64_t> host(cp_,
                                    engine_->options().host_pages_per_rank);
    for (const NodeInfo& n : engine_->Dump(DumpFilter{})) {
      (void)engine_->Pin(n.id, absl::ZeroDuration());
    }
    CheckGuaranteesThenClear(device, host);
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
      Settle();
      freed = engine_->EvictPages({}, host);
      if (!freed.ok()) {
        Fail(absl::StrCat("drain: EvictPages(host): ",
                          freed.status().ToString()),
             engine_.get());
      }
      Settle();
    }
    CheckSettled("after evicting everything");
    int64_t host_used = 0;
    for (Rank r = 0; r < cp_; ++r) host_used += engine_->HostUsedPages(r);
    const TreeStats stats = engine_->TreeStatistics();
    if (engine_->DeviceAllocatedPages() != 0 || host_used != 0 ||
        stats.nodes != 0) {
      std::string left;
      for (const NodeInfo& n : engine_->Dump(DumpFilter{})) {
        absl::StrAppend(&left, "; node ", n.id, " (parent ", n.parent,
                        ", tokens [", n.start, ", ", n.start + n.len,
                        "), host_ref ", n.host_ref, ", lock_ref ",
                        n.lock_ref, ", pending_backup ", n.pending_backup,
                        ", pinned ", n.pin_remaining_ms, " ms, children ",
                        n.num_children, ")");
      }
      Fail(absl::StrCat(
               "after evicting everything: ", engine_->DeviceAllocatedPages(),
               " device pages allocated, ", host_used, " host pages used, ",
               stats.nodes, " nodes left", left),
           engine_.get());
    }
  }

  Input& in_;
  FakeClock clock_{absl::FromUnixSeconds(1000)};
  HeapBackend backend_;
  EventHub hub_;
  EventCounter counter_{&hub_};
  service::WatchBroadcaster watch_;
  std::unique_ptr<HiCacheEngine> engine_;
  std::unique_ptr<SessionManager> sessions_;
  Service::Callers callers_;
  std::unique_ptr<service::HiCacheService> rpcs_;
  std::unique_ptr<Service> service_;
  uint32_t cp_ = 1;
  uint32_t steps_ = 1;
  bool settle_each_op_ = false;
  GatedTransferEngine* gate_ = nullptr;  // Owned by the engine.
  int hold_ops_ = 0;  // Ops left until the gate opens (0: open).

  std::optional<SessionState> slots_[kSlots];
  std::vector<std::string> opened_;  // Every session id, open or not.
  absl::flat_hash_map<std::string, std::string> session_ns_;  // Id -> ns.
  absl::flat_hash_map<uint64_t, std::string> op_ns_;  // Backup/load -> ns.
  std::vector<LogicalPage> pages_;   // Page ids seen in any answer.
  std::vector<NodeId> nodes_;
  std::vector<uint64_t> backups_;
  std::vector<uint64_t> handles_;    // Lock handles seen in any answer.
  std::vector<uint64_t> load_ids_;   // Loads started by anyone.
  BackupRpc streams_[kSlots + 1];    // Per slot, and a scratch one.
  std::vector<std::unique_ptr<LoadRpc>> loads_;  // Started, not finished.
  SubscribeRpc subs_[kSlots + 1];    // Per slot, and a scratch one.
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
