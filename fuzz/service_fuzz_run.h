// One input of //fuzz:service_fuzzer: a fresh daemon (engine, sessions,
// service) and the ops decoded from the input on it. Run's member functions
// are defined by concern:
//   service_fuzz_run.cc               lifecycle (Start, Ops, Finish), the op
//                                     dispatch (Do), the copy gate (Hold)
//   service_fuzz_model.cc             what the fuzzer knows of the sessions;
//                                     operands picked from it
//   service_fuzz_checks.cc            answers checked; the final accounting
//   service_fuzz_streams.cc           the streaming RPCs' server sides
//   service_fuzz_session_ops.cc       sessions, Allocate, Free, Lock, Pin
//   service_fuzz_match_insert_ops.cc  MatchPrefix and Insert
//   service_fuzz_operator_ops.cc      Evict, SetFreeRoom, quotas, inspection
//   service_fuzz_backup_ops.cc        BackupSession messages
//   service_fuzz_load_ops.cc          LoadBack, FinishLoad, Subscribe, fences
//   service_fuzz_admit_ops.cc         Admit and Complete
//   service_fuzz_scripted_ops.cc      whole requests (Request, Flow)
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/core/clock.h"
#include "daemon/engine/backup_stream.h"
#include "daemon/engine/caller.h"
#include "daemon/engine/event_hub.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/load_stream.h"
#include "daemon/engine/session_manager.h"
#include "daemon/engine/worker_subscription.h"
#include "daemon/service/hicache_service.h"
#include "daemon/service/watch_broadcaster.h"
#include "fuzz/service_fuzz_adapter.h"
#include "fuzz/service_fuzz_backend.h"
#include "fuzz/service_fuzz_event_counter.h"
#include "fuzz/service_fuzz_input.h"
#include "grpcpp/server_context.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::fuzz {

constexpr int kMaxOps = 200;
constexpr int kSlots = 4;
constexpr size_t kMaxKnown = 64;     // Remembered page / node / backup ids.
constexpr size_t kMaxAdmitted = 16;  // Admitted requests kept per session.

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
  std::unique_ptr<BackupStream> stream;          // Null: no RPC.
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
  std::set<uint64_t> loads;             // Started.
  std::vector<LoadStream::Event> done;  // Terminal events taken.
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
// What the fuzzer knows of the sessions.

template <typename T>
void Remember(std::vector<T>& known, T value) {
  if (std::find(known.begin(), known.end(), value) != known.end()) return;
  if (known.size() >= kMaxKnown) known.erase(known.begin());
  known.push_back(value);
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

// ---------------------------------------------------------------------------
// One input: a fresh daemon (engine, sessions, service) and the ops on it.

class Run {
 public:
  explicit Run(Input& in) : in_(in) {}
  ~Run();

  // Builds the daemon the header bytes describe.
  void Start();
  // Runs the input's ops (up to kMaxOps); after each, the streams' server
  // sides run as far as they can and the engine's invariants must hold.
  void Ops();
  // Closes everything, settles and checks that every page is accounted for.
  // The clients go away: streams end (half-closed, or broken, before or
  // after the sessions close, as the last input byte says).
  void Finish();

 private:
  struct InsertItem {
    Tokens tokens;
    std::vector<LogicalPage> pages;
    bool unfinished = false;
    uint64_t backup = 0;
  };

  struct CompleteSource {
    int admitted = -1;  // Index in the session's admitted requests, or -1.
    std::vector<LogicalPage> insert;
    std::vector<LogicalPage> free;
    std::vector<uint64_t> handles;
    bool free_uncached = true;
  };

  static constexpr int kModes[] = {v1::COMPUTE_OWNER_MODE_UNSPECIFIED,
                                   v1::COMPUTE_OWNER_MODE_ZIGZAG,
                                   v1::COMPUTE_OWNER_MODE_ROUND_ROBIN, 77};
  static constexpr int kChoices[] = {v1::BACKUP_CHOICE_AUTO,
                                     v1::BACKUP_CHOICE_NEVER,
                                     v1::BACKUP_CHOICE_ALWAYS, 99};

  // --- Lifecycle, op dispatch, the copy gate (service_fuzz_run.cc) ---------
  void Do(int op);
  void Settle();
  void OpenGate();
  void HoldOp();

  // --- The sessions as the fuzzer knows them (service_fuzz_model.cc) -------
  std::string PickSessionId(SessionState** state, int* slot_out = nullptr);
  SessionState* StateOf(const std::string& id);
  LogicalPage PickPage(SessionState* s);
  std::vector<LogicalPage> PickPages(SessionState* s, size_t n);
  NodeId PickNode();
  uint64_t PickBackup(SessionState* s);
  uint64_t PickAnyBackup();
  uint64_t PickHandle(SessionState* s);
  void ForgetOwned(SessionState* s, const std::vector<LogicalPage>& pages);
  void AddHandle(const std::string& session, uint64_t handle);
  void KeepAdmitted(SessionState* s, Admitted a);
  void SyncSlots();

  // --- Checks (service_fuzz_checks.cc) -------------------------------------
  void Check(absl::string_view what, const grpc::Status& status);
  void Check(absl::string_view what, const absl::Status& status);
  void CheckRefusalChangedNothing(absl::string_view what,
                                  const grpc::Status& status,
                                  const SessionManager::Totals& before);
  void CheckSettled(absl::string_view when);
  void CheckGuaranteesThenClear(const std::vector<int64_t>& device,
                                const std::vector<int64_t>& host);
  void Drain();

  // --- Streams' server sides (service_fuzz_streams.cc) ---------------------
  absl::Status BackupMessage(BackupRpc& rpc, const v1::BackupClientMessage& in,
                             size_t backlog, std::vector<uint64_t>* prepared,
                             bool* ended);
  void PumpBackup(BackupRpc& rpc);
  void EndBackup(BackupRpc& rpc, bool broken);
  std::unique_ptr<LoadRpc> StartLoadBack(const v1::LoadBackRequest& request,
                                         size_t backlog, absl::Status* failed,
                                         std::vector<LoadResult>* started);
  void TakeLoadEvent(LoadRpc& rpc, const LoadStream::Event& event);
  bool PumpLoad(LoadRpc& rpc);
  absl::Status FinishLoadRpc(LoadRpc& rpc, bool wait);
  void TakeWorkerEvent(SubscribeRpc& sub, const OpEvent& event);
  void PumpSubscription(SubscribeRpc& sub);
  void PumpStreams();
  void EndStreams(bool broken, bool sessions_closed);

  // --- Ops: sessions, pages, locks (service_fuzz_session_ops.cc) -----------
  void OpenOp();
  void CloseOp();
  void KeepAliveOp();
  void AdvanceOp();
  void AllocateOp();
  std::vector<LogicalPage> AllocatePages(const std::string& id, SessionState* s,
                                         int64_t n, int mode,
                                         grpc::Status* status_out);
  void FreeOp();
  void LockOp();
  void UnlockHandlesOp();
  void PinOp();

  // --- Ops: MatchPrefix, Insert (service_fuzz_match_insert_ops.cc) ---------
  std::optional<v1::MatchResult> Match(const std::string& id, SessionState* s,
                                       const std::vector<Tokens>& items,
                                       bool lock, bool peek,
                                       bool exact_tail = false);
  void MatchOp();
  void MatchExactOp();
  std::vector<LogicalPage> InsertPages(SessionState* s, size_t len);
  void Inserted(SessionState* s, const std::vector<LogicalPage>& pages,
                const v1::InsertResult& r);
  std::optional<v1::InsertResult> Insert(const std::string& id, SessionState* s,
                                         const std::vector<InsertItem>& items);
  void InsertOp();

  // --- Ops: operator RPCs, quotas (service_fuzz_operator_ops.cc) -----------
  void EvictOp();
  void SetFreeRoomOp();
  void QuotaOp();
  static const Caller& As(uint8_t b);
  void InspectOp();

  // --- Ops: BackupSession (service_fuzz_backup_ops.cc) ---------------------
  BackupRpc& StreamFor(int slot, const std::string& id, uint8_t b,
                       v1::BackupClientMessage* message);
  absl::Status Backup(int slot, const std::string& id, SessionState* s,
                      v1::BackupClientMessage& message, uint8_t b,
                      absl::string_view what,
                      std::vector<uint64_t>* prepared = nullptr,
                      size_t backlog = kBacklog);
  void PrepareOp();
  void LayerStoredOp();
  void WorkerStoreOp();
  void StoreAllOp();
  void RollbackOp();
  void BackupOpenOp();
  void StreamEndOp();

  // --- Ops: LoadBack, Subscribe, fences (service_fuzz_load_ops.cc) ---------
  void LoadBackOp();
  void LoadBatchOp();
  void FinishLoadOp();
  void FinishLoadRpcOp();
  void SubscribeOp();
  void UnsubscribeOp();
  void FenceOp();

  // --- Ops: Admit, Complete (service_fuzz_admit_ops.cc) --------------------
  std::optional<v1::AdmitResponse> Admit(const std::string& id, SessionState* s,
                                         const v1::AdmitRequest& request);
  void AdmitOp();
  void CompleteOp();
  std::optional<v1::CompleteResponse> Complete(
      const std::string& id, SessionState* s,
      const v1::CompleteRequest& request,
      const std::vector<CompleteSource>& sources);

  // --- Ops: whole requests (service_fuzz_scripted_ops.cc) ------------------
  void RequestOp();
  void FlowOp();
  void StoreLayers(const std::string& id, SessionState* s, int slot,
                   uint64_t backup, uint8_t f);
  void ReleaseFlow(const std::string& id, SessionState* s, int slot,
                   const Admitted& a);

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
  std::vector<LogicalPage> pages_;  // Page ids seen in any answer.
  std::vector<NodeId> nodes_;
  std::vector<uint64_t> backups_;
  std::vector<uint64_t> handles_;   // Lock handles seen in any answer.
  std::vector<uint64_t> load_ids_;  // Loads started by anyone.
  BackupRpc streams_[kSlots + 1];   // Per slot, and a scratch one.
  std::vector<std::unique_ptr<LoadRpc>> loads_;  // Started, not finished.
  SubscribeRpc subs_[kSlots + 1];                // Per slot, and a scratch one.
};

}  // namespace hicache::fuzz
