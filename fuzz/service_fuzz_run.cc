// The lifecycle of one input of //fuzz:service_fuzzer (Run,
// service_fuzz_run.h): the daemon the header bytes describe, the ops loop and
// its dispatch, the copy gate, and the teardown.
#include "fuzz/service_fuzz_run.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/core/clock.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"
#include "daemon/service/hicache_service.h"
#include "daemon/transfer/faulty_transfer_engine.h"
#include "fuzz/service_fuzz_report.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::fuzz {

void Run::Start() {
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
    options.eviction_policy =
        ((h0 >> 4) & 1) != 0 ? EvictionPolicy::kTinyLfu : EvictionPolicy::kSlru;
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
        faulty->SetRandom(
            {.seed = seed, .device_to_host = fault, .host_to_device = fault});
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
  if (gate_ == nullptr)
    Fail("the engine did not build its copy engine", nullptr);
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
  service_ = std::make_unique<Service>(rpcs_.get(), &callers_, sessions_.get(),
                                       engine_.get(), &hub_);
}

void Run::Ops() {
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

void Run::Finish() {
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

Run::~Run() {
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

void Run::Do(int op) {
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

// Every copy completes (the held ones are let go first).
void Run::Settle() {
  OpenGate();
  engine_->WaitForTransfers();
}

void Run::OpenGate() {
  if (gate_ == nullptr || !gate_->closed()) return;
  Trace("    gate opens: ", gate_->held(), " copy tasks go");
  hold_ops_ = 0;
  gate_->Open();
}

// Copies submitted from now on are held (not even started) for the next
// 1-8 ops, or until something waits for the copies; with bit 4 the held
// ones go now instead.
void Run::HoldOp() {
  const uint8_t b = in_.Byte();
  if ((b & 0x10) != 0) {
    OpenGate();
    return;
  }
  hold_ops_ = 1 + (b & 7);
  gate_->Close();
  Trace("    copies held for ", hold_ops_, " ops");
}

}  // namespace hicache::fuzz
