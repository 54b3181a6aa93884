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
//   then    ops: one opcode byte (enum Op in service_fuzz_input.h, modulo
//           kNumOps) and its operand bytes, until the input ends (reads
//           past the end give 0) or kMaxOps ops ran. New opcodes go at the
//           end of Op, so that the opcode bytes of older inputs keep their
//           meaning.
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
//   are repeated here (Run::StartLoadBack in service_fuzz_streams.cc; keep
//   it in step with daemon/service/hicache_service_streams.cc).
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
//
// Code: this file holds the libFuzzer entry points; service_fuzz_run.h
// declares Run (one input) and lists the files that define it by concern;
// service_fuzz_input.h decodes the input, service_fuzz_adapter.h calls the
// service, service_fuzz_backend.h and service_fuzz_event_counter.h are the
// daemon parts the fuzzer builds the engine on.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "fuzz/service_fuzz_input.h"
#include "fuzz/service_fuzz_report.h"
#include "fuzz/service_fuzz_run.h"
#include "spdlog/spdlog.h"

namespace hicache::fuzz {
namespace {

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
