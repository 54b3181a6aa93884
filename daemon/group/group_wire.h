#pragma once

// The wire format between the daemons of a CP group (docs/cp-groups.md,
// "Wire format and remote transfers"): the frames a leader and a follower
// exchange over one comm::Communicator link. Hand-packed, little-endian,
// versioned; no protobuf (the group layer sees no protobuf header).
//
// Frame = header (18 bytes) + body:
//
//   u8  version   kWireVersion (1)
//   u8  kind      FrameKind
//   u64 epoch     the member's epoch (a readmitted member gets a new one)
//   u64 seq       1 for the first frame a side sends on a link, then +1
//
// Bodies (all integers little-endian, no padding):
//
//   Hello, Heartbeat (12 bytes):
//     i64 sender_time_ns, u32 member_index
//   Tasks:
//     u32 n, then n tasks:
//       u64 op_id, u8 direction (0 device->host, 1 host->device),
//       u32 step, u32 n_ranks, then n_ranks rank copies:
//         u32 rank, u64 wait_fence, PageList device_pages,
//         PageList host_pages
//   StepDones:
//     u32 n, then n completions:
//       u64 op_id, u8 direction, u32 rank, u32 step,
//       u8 status code (absl::StatusCode, 0..16), Str message (empty for OK),
//       u64 bytes, Str fence
//   Bye:
//     Str reason
//   WorkerEvents (leader -> follower; docs/cp-groups.md, "Worker events and
//   acks across the link"):
//     u32 n, then n events:
//       u64 op, u8 event kind (WorkerEventKind, 0..4), u32 rank, u32 step,
//       u8 ok (0 or 1), Str fence, Str namespace
//   LayerStored (follower -> leader, a local worker's layer ack):
//     u64 request_id, Str namespace, u32 rank, u32 step,
//     u32 n, then n u64 op ids
//   LayerStoredAck (leader -> follower):
//     u64 request_id, u8 status code, Str message (empty for OK)
//   Digest (leader -> follower; docs/cp-groups.md, "Step deadline and
//   accounting digest"):
//     u64 tasks_frames, u32 n (at most kMaxDigestRanks), then n RankTally
//   DigestResult (follower -> leader):
//     u64 tasks_frames, u8 match (0 or 1), u32 n (at most kMaxDigestRanks),
//     then n RankTally
//   RankTally (68 bytes): u32 rank, u64 device_pages_per_rank,
//     u64 host_pages_per_rank, u64 copies_d2h, u64 copies_h2d,
//     u64 pages_d2h, u64 pages_h2d, u64 refused, u64 hash
//
//   PageList: u32 count, then count varints: page[i] - page[i-1] (page[-1] =
//     0, wrapping 64-bit arithmetic), zigzag-mapped, as LEB128 (7 bits a
//     byte, low groups first, minimal length). Consecutive pages cost one
//     byte each.
//   Str: u32 length, then that many bytes.
//
// Decoding takes untrusted bytes. Every count is checked against the bytes
// that remain (each element costs at least one byte) before anything is
// allocated, so a frame of B bytes allocates O(B); the body must be consumed
// exactly; an unknown version is INVALID_ARGUMENT, anything else malformed
// (unknown kind, truncation, trailing bytes, a count past the end, a
// non-minimal varint, a direction or status code out of range, an OK status
// with a message) is DATA_LOSS naming the field. Decoding is canonical:
// whatever decodes re-encodes to the same bytes.
//
// New kinds get new numbers; a peer that does not know a kind refuses the
// frame (and the link dies), so both sides of a link must run the same
// kWireVersion (checked at Join).

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache::group {

inline constexpr uint8_t kWireVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 18;

enum class FrameKind : uint8_t {
  kHello = 1,
  kHeartbeat = 2,
  kTasks = 3,
  kStepDones = 4,
  kBye = 5,
  // Worker events and acks across the link (kinds 6-8).
  kWorkerEvents = 6,
  kLayerStored = 7,
  kLayerStoredAck = 8,
  // The pool-accounting digest (kinds 9-10; copy_digest.h).
  kDigest = 9,
  kDigestResult = 10,
};

// "hello", "heartbeat", ..., or "kind 9" for an unknown one.
std::string FrameKindName(uint8_t kind);

struct FrameHeader {
  uint8_t version = kWireVersion;
  FrameKind kind = FrameKind::kHello;
  uint64_t epoch = 0;
  uint64_t seq = 0;
  bool operator==(const FrameHeader&) const = default;
};

struct Hello {
  int64_t sender_time_ns = 0;
  uint32_t member_index = 0;
  bool operator==(const Hello&) const = default;
};

struct Heartbeat {
  int64_t sender_time_ns = 0;
  uint32_t member_index = 0;
  bool operator==(const Heartbeat&) const = default;
};

struct TaskBatch {
  std::vector<TransferTask> tasks;
};

struct StepDoneBatch {
  std::vector<StepDone> dones;
};

struct Bye {
  std::string reason;
  bool operator==(const Bye&) const = default;
};

// ---- Worker events and acks across the link (kinds 6-8) -------------------

// OpEvent::Type's values, in its order.
enum class WorkerEventKind : uint8_t {
  kBackupStep = 0,
  kCommitted = 1,
  kRolledBack = 2,
  kLoadStep = 3,
  kLoadDone = 4,
};

// One event the leader's EventHub fanned out to its subscribers, with the
// namespace its op is tagged with.
struct WorkerEventRecord {
  uint64_t op = 0;
  WorkerEventKind kind = WorkerEventKind::kBackupStep;
  uint32_t rank = 0;
  uint32_t step = 0;
  bool ok = true;
  std::string fence;
  std::string ns;
  bool operator==(const WorkerEventRecord&) const = default;
};

struct WorkerEventBatch {
  std::vector<WorkerEventRecord> events;
  bool operator==(const WorkerEventBatch&) const = default;
};

// A follower's local worker of `rank` (namespace `ns`) wrote layer `step`
// of `ops`.
struct LayerStoredRequest {
  uint64_t request_id = 0;
  std::string ns;
  uint32_t rank = 0;
  uint32_t step = 0;
  std::vector<uint64_t> ops;
  bool operator==(const LayerStoredRequest&) const = default;
};

// The leader's answer to the LayerStoredRequest of `request_id`.
struct LayerStoredAck {
  uint64_t request_id = 0;
  absl::Status status;
};

// What a LayerStoredRequest may carry (both sides refuse more): ops, as a
// SessionManager's default max_items_per_request, and namespace bytes.
inline constexpr size_t kMaxLayerStoredOps = 4096;
inline constexpr size_t kMaxLayerStoredNamespaceBytes = 1024;

// Bytes of one event inside a WorkerEvents body (for batching under
// comm::kMaxFrameBytes; the frame is kFrameHeaderBytes + 4 + the sum).
size_t EncodedWorkerEventBytes(const WorkerEventRecord& event);

// ---- End of kinds 6-8 -------------------------------------------------------

// ---- The pool-accounting digest (kinds 9-10; copy_digest.h) ----------------

// What one side accounts of the copies one rank ran over the link: the
// pools' geometry and tallies of the copy stream (see CopyTally).
struct RankTally {
  uint32_t rank = 0;
  uint64_t device_pages_per_rank = 0;  // 0 in the leader's: not known.
  uint64_t host_pages_per_rank = 0;    // 0 in the leader's: not known.
  uint64_t copies_d2h = 0;
  uint64_t copies_h2d = 0;
  uint64_t pages_d2h = 0;
  uint64_t pages_h2d = 0;
  uint64_t refused = 0;  // Copies the follower's checks refused.
  uint64_t hash = 0;     // Ordered hash of every copy accepted.
  bool operator==(const RankTally&) const = default;
};

// A digest bounds its rank count (a decoder refuses more).
inline constexpr uint32_t kMaxDigestRanks = 4096;

// The leader's tallies of the copies it shipped on this link in its first
// `tasks_frames` Tasks frames.
struct Digest {
  uint64_t tasks_frames = 0;
  std::vector<RankTally> ranks;
  bool operator==(const Digest&) const = default;
};

// The follower's answer: its own tallies as of the same Tasks frame and
// whether they match the leader's.
struct DigestResult {
  uint64_t tasks_frames = 0;
  bool match = false;
  std::vector<RankTally> ranks;
  bool operator==(const DigestResult&) const = default;
};

// ---- End of kinds 9-10 ------------------------------------------------------

// The alternatives, in FrameKind order (index + 1 == kind).
using FrameBody = std::variant<Hello, Heartbeat, TaskBatch, StepDoneBatch, Bye,
                               WorkerEventBatch, LayerStoredRequest,
                               LayerStoredAck, Digest, DigestResult>;

struct Frame {
  FrameHeader header;  // header.kind always matches body.
  FrameBody body;
};

// The kind of a body.
FrameKind KindOf(const FrameBody& body);

// Encodes a whole frame; header.kind is taken from the body. Any value
// encodes (mismatched page lists, a negative page: the receiver checks
// meaning, the wire only shape); a status code outside absl's is sent as
// UNKNOWN.
std::string EncodeFrame(uint64_t epoch, uint64_t seq, const FrameBody& body);
inline std::string EncodeFrame(const Frame& frame) {
  return EncodeFrame(frame.header.epoch, frame.header.seq, frame.body);
}

// Just the header (version and kind checked, body untouched).
absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::string_view frame);

// The whole frame.
absl::StatusOr<Frame> DecodeFrame(absl::string_view frame);

// Sizes, for batching under comm::kMaxFrameBytes: the encoded bytes of one
// task inside a Tasks body, of one rank copy inside a task, and of one
// completion inside a StepDones body. A Tasks frame is kFrameHeaderBytes + 4
// + the sum of its tasks' sizes; likewise StepDones.
size_t EncodedTaskBytes(const TransferTask& task);
size_t EncodedRankCopyBytes(const RankCopy& copy);
size_t EncodedStepDoneBytes(const StepDone& done);
// The fixed part of a task (without its rank copies).
inline constexpr size_t kTaskFixedBytes = 8 + 1 + 4 + 4;

// Field-by-field equality (the transfer structs have no operator==).
bool SameTask(const TransferTask& a, const TransferTask& b);
bool SameStepDone(const StepDone& a, const StepDone& b);
bool SameFrame(const Frame& a, const Frame& b);

}  // namespace hicache::group
