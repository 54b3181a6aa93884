#include "daemon/group/group_wire.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/core/le_bytes.h"

namespace hicache::group {
namespace {

// The smallest encoding of each repeated element: bounds counts before
// anything is allocated.
constexpr size_t kMinTaskBytes = kTaskFixedBytes;
constexpr size_t kMinRankCopyBytes = 4 + 8 + 4 + 4;
constexpr size_t kMinStepDoneBytes = 8 + 1 + 4 + 4 + 1 + 4 + 8 + 4;
constexpr uint8_t kMaxStatusCode = 16;  // absl::StatusCode::kUnauthenticated.
// Kinds 6-8: the smallest event (empty fence and namespace) and op id.
constexpr size_t kMinWorkerEventBytes = 8 + 1 + 4 + 4 + 1 + 4 + 4;
constexpr size_t kOpIdBytes = 8;
constexpr uint8_t kMaxWorkerEventKind = 4;  // WorkerEventKind::kLoadDone.
// Kinds 9-10: one RankTally.
constexpr size_t kRankTallyBytes = 4 + 8 * 8;

// ---- Encoding --------------------------------------------------------------

// LEB128: 7 bits a byte, low bits first, the high bit set on all but the
// last byte.
void PutVarint(LeWriter& w, uint64_t v) {
  while (v >= 0x80) {
    w.U8(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  w.U8(static_cast<uint8_t>(v));
}

// A PageList: u32 count, then zigzag-mapped deltas as varints.
template <typename T>
void PutPages(LeWriter& w, const std::vector<T>& pages) {
  w.U32(static_cast<uint32_t>(pages.size()));
  uint64_t prev = 0;
  for (T page : pages) {
    const uint64_t cur = static_cast<uint64_t>(page);
    const uint64_t delta = cur - prev;  // Wrapping.
    // Zigzag: small negative and positive deltas both stay small.
    const uint64_t zz = (delta << 1) ^ (0 - (delta >> 63));
    PutVarint(w, zz);
    prev = cur;
  }
}

size_t VarintBytes(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

template <typename T>
size_t PagesBytes(const std::vector<T>& pages) {
  size_t n = 4;
  uint64_t prev = 0;
  for (T page : pages) {
    const uint64_t cur = static_cast<uint64_t>(page);
    const uint64_t delta = cur - prev;
    n += VarintBytes((delta << 1) ^ (0 - (delta >> 63)));
    prev = cur;
  }
  return n;
}

uint8_t WireCode(const absl::Status& status) {
  const int code = static_cast<int>(status.code());
  return code >= 0 && code <= kMaxStatusCode
             ? static_cast<uint8_t>(code)
             : static_cast<uint8_t>(absl::StatusCode::kUnknown);
}

void EncodeTask(LeWriter& w, const TransferTask& task) {
  w.U64(task.op_id);
  w.U8(task.direction == TransferDirection::kDeviceToHost ? 0 : 1);
  w.U32(task.step);
  w.U32(static_cast<uint32_t>(task.ranks.size()));
  for (const RankCopy& copy : task.ranks) {
    w.U32(copy.rank);
    w.U64(copy.wait_fence);
    PutPages(w, copy.device_pages);
    PutPages(w, copy.host_pages);
  }
}

void EncodeStepDone(LeWriter& w, const StepDone& done) {
  w.U64(done.op_id);
  w.U8(done.direction == TransferDirection::kDeviceToHost ? 0 : 1);
  w.U32(done.rank);
  w.U32(done.step);
  const uint8_t code = WireCode(done.status);
  w.U8(code);
  w.String(code == 0 ? absl::string_view() : done.status.message());
  w.U64(done.bytes);
  w.String(done.fence);
}

struct BodyEncoder {
  LeWriter& w;
  void operator()(const Hello& h) const {
    w.U64(static_cast<uint64_t>(h.sender_time_ns));
    w.U32(h.member_index);
  }
  void operator()(const Heartbeat& h) const {
    w.U64(static_cast<uint64_t>(h.sender_time_ns));
    w.U32(h.member_index);
  }
  void operator()(const TaskBatch& b) const {
    w.U32(static_cast<uint32_t>(b.tasks.size()));
    for (const TransferTask& task : b.tasks) EncodeTask(w, task);
  }
  void operator()(const StepDoneBatch& b) const {
    w.U32(static_cast<uint32_t>(b.dones.size()));
    for (const StepDone& done : b.dones) EncodeStepDone(w, done);
  }
  void operator()(const Bye& b) const { w.String(b.reason); }
  // Kinds 6-8.
  void operator()(const WorkerEventBatch& b) const {
    w.U32(static_cast<uint32_t>(b.events.size()));
    for (const WorkerEventRecord& e : b.events) {
      w.U64(e.op);
      w.U8(static_cast<uint8_t>(e.kind));
      w.U32(e.rank);
      w.U32(e.step);
      w.U8(e.ok ? 1 : 0);
      w.String(e.fence);
      w.String(e.ns);
    }
  }
  void operator()(const LayerStoredRequest& r) const {
    w.U64(r.request_id);
    w.String(r.ns);
    w.U32(r.rank);
    w.U32(r.step);
    w.U32(static_cast<uint32_t>(r.ops.size()));
    for (uint64_t op : r.ops) w.U64(op);
  }
  void operator()(const LayerStoredAck& a) const {
    w.U64(a.request_id);
    const uint8_t code = WireCode(a.status);
    w.U8(code);
    w.String(code == 0 ? absl::string_view() : a.status.message());
  }
  // Kinds 9-10.
  void Tallies(const std::vector<RankTally>& ranks) const {
    w.U32(static_cast<uint32_t>(ranks.size()));
    for (const RankTally& t : ranks) {
      w.U32(t.rank);
      w.U64(t.device_pages_per_rank);
      w.U64(t.host_pages_per_rank);
      w.U64(t.copies_d2h);
      w.U64(t.copies_h2d);
      w.U64(t.pages_d2h);
      w.U64(t.pages_h2d);
      w.U64(t.refused);
      w.U64(t.hash);
    }
  }
  void operator()(const Digest& d) const {
    w.U64(d.tasks_frames);
    Tallies(d.ranks);
  }
  void operator()(const DigestResult& d) const {
    w.U64(d.tasks_frames);
    w.U8(d.match ? 1 : 0);
    Tallies(d.ranks);
  }
};

// ---- Decoding --------------------------------------------------------------

// The frame body's reader: LeReader, with errors that name the field and
// the byte (counted from the start of the frame).
class Reader {
 public:
  explicit Reader(absl::string_view data) : in_(data), size_(data.size()) {}
  size_t remaining() const { return in_.remaining(); }
  size_t pos() const { return size_ - in_.remaining(); }

  absl::Status U8(const char* what, uint8_t* v) {
    return in_.U8(v) ? absl::OkStatus() : Truncated(what);
  }
  absl::Status U32(const char* what, uint32_t* v) {
    return in_.U32(v) ? absl::OkStatus() : Truncated(what);
  }
  absl::Status U64(const char* what, uint64_t* v) {
    return in_.U64(v) ? absl::OkStatus() : Truncated(what);
  }
  absl::Status Str(const char* what, std::string* s) {
    uint32_t n = 0;
    if (absl::Status st = U32(what, &n); !st.ok()) return st;
    absl::string_view bytes;
    if (!in_.Bytes(n, &bytes)) {
      return Bad(absl::StrCat(what, ": length ", n, " but only ", remaining(),
                              " bytes remain"));
    }
    s->assign(bytes.data(), bytes.size());
    return absl::OkStatus();
  }
  // A count of elements that take at least `min_bytes` each.
  absl::Status Count(const char* what, size_t min_bytes, uint32_t* n) {
    if (in_.Count(min_bytes, n)) return absl::OkStatus();
    // Truncated, or too large: take the count to name it (the error's byte
    // is the one after it).
    uint32_t count = 0;
    if (absl::Status st = U32(what, &count); !st.ok()) return st;
    return Bad(absl::StrCat(what, ": count ", count, " needs at least ",
                            static_cast<uint64_t>(count) * min_bytes,
                            " bytes but only ", remaining(), " remain"));
  }
  absl::Status Varint(const char* what, uint64_t* v) {
    uint64_t x = 0;
    for (int i = 0; i < 10; ++i) {
      uint8_t b = 0;
      if (!in_.U8(&b)) return Truncated(what);
      if (i == 9 && b > 1) return Bad(absl::StrCat(what, ": varint overflows"));
      x |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
      if ((b & 0x80) == 0) {
        if (b == 0 && i > 0) {
          return Bad(absl::StrCat(what, ": varint is not minimal"));
        }
        *v = x;
        return absl::OkStatus();
      }
    }
    return Bad(absl::StrCat(what, ": varint longer than 10 bytes"));
  }
  template <typename T>
  absl::Status Pages(const char* what, std::vector<T>* pages) {
    uint32_t n = 0;
    if (absl::Status st = Count(what, 1, &n); !st.ok()) return st;
    pages->resize(n);
    uint64_t prev = 0;
    for (uint32_t i = 0; i < n; ++i) {
      uint64_t zz = 0;
      if (absl::Status st = Varint(what, &zz); !st.ok()) return st;
      const uint64_t delta = (zz >> 1) ^ (0 - (zz & 1));
      prev += delta;  // Wrapping.
      (*pages)[i] = static_cast<T>(prev);
    }
    return absl::OkStatus();
  }
  absl::Status Direction(const char* what, TransferDirection* d) {
    uint8_t v = 0;
    if (absl::Status st = U8(what, &v); !st.ok()) return st;
    if (v > 1)
      return Bad(absl::StrCat(what, ": direction ", v, " is not 0 or 1"));
    *d = v == 0 ? TransferDirection::kDeviceToHost
                : TransferDirection::kHostToDevice;
    return absl::OkStatus();
  }

  absl::Status Truncated(const char* what) const {
    return Bad(absl::StrCat(what, ": truncated"));
  }
  absl::Status Bad(absl::string_view why) const {
    return absl::DataLossError(absl::StrCat("malformed group frame at byte ",
                                            pos() + kFrameHeaderBytes, ": ",
                                            why));
  }

 private:
  LeReader in_;
  const size_t size_;
};

#define WIRE_RETURN_IF_ERROR(expr)               \
  do {                                           \
    absl::Status wire_status_ = (expr);          \
    if (!wire_status_.ok()) return wire_status_; \
  } while (0)

absl::Status DecodeTask(Reader& r, TransferTask* task) {
  uint32_t step = 0;
  uint32_t n = 0;
  WIRE_RETURN_IF_ERROR(r.U64("task op_id", &task->op_id));
  WIRE_RETURN_IF_ERROR(r.Direction("task direction", &task->direction));
  WIRE_RETURN_IF_ERROR(r.U32("task step", &step));
  task->step = step;
  WIRE_RETURN_IF_ERROR(r.Count("task rank count", kMinRankCopyBytes, &n));
  task->ranks.resize(n);
  for (RankCopy& copy : task->ranks) {
    uint32_t rank = 0;
    WIRE_RETURN_IF_ERROR(r.U32("rank", &rank));
    copy.rank = rank;
    WIRE_RETURN_IF_ERROR(r.U64("wait_fence", &copy.wait_fence));
    WIRE_RETURN_IF_ERROR(r.Pages("device pages", &copy.device_pages));
    WIRE_RETURN_IF_ERROR(r.Pages("host pages", &copy.host_pages));
  }
  return absl::OkStatus();
}

absl::Status DecodeStepDone(Reader& r, StepDone* done) {
  uint32_t rank = 0;
  uint32_t step = 0;
  uint8_t code = 0;
  std::string message;
  WIRE_RETURN_IF_ERROR(r.U64("step_done op_id", &done->op_id));
  WIRE_RETURN_IF_ERROR(r.Direction("step_done direction", &done->direction));
  WIRE_RETURN_IF_ERROR(r.U32("step_done rank", &rank));
  WIRE_RETURN_IF_ERROR(r.U32("step_done step", &step));
  WIRE_RETURN_IF_ERROR(r.U8("step_done status code", &code));
  if (code > kMaxStatusCode) {
    return r.Bad(absl::StrCat("step_done status code ", code,
                              " is not an absl::StatusCode"));
  }
  WIRE_RETURN_IF_ERROR(r.Str("step_done status message", &message));
  if (code == 0 && !message.empty()) {
    return r.Bad("step_done: an OK status carries a message");
  }
  WIRE_RETURN_IF_ERROR(r.U64("step_done bytes", &done->bytes));
  WIRE_RETURN_IF_ERROR(r.Str("step_done fence", &done->fence));
  done->rank = rank;
  done->step = step;
  done->status = absl::Status(static_cast<absl::StatusCode>(code), message);
  return absl::OkStatus();
}

// ---- Kinds 6-8 (worker events and acks) ----

absl::Status DecodeWorkerEvent(Reader& r, WorkerEventRecord* e) {
  uint8_t kind = 0;
  uint8_t ok = 0;
  WIRE_RETURN_IF_ERROR(r.U64("worker_event op", &e->op));
  WIRE_RETURN_IF_ERROR(r.U8("worker_event kind", &kind));
  if (kind > kMaxWorkerEventKind) {
    return r.Bad(absl::StrCat("worker_event kind ", kind, " is not 0..",
                              kMaxWorkerEventKind));
  }
  e->kind = static_cast<WorkerEventKind>(kind);
  WIRE_RETURN_IF_ERROR(r.U32("worker_event rank", &e->rank));
  WIRE_RETURN_IF_ERROR(r.U32("worker_event step", &e->step));
  WIRE_RETURN_IF_ERROR(r.U8("worker_event ok", &ok));
  if (ok > 1)
    return r.Bad(absl::StrCat("worker_event ok ", ok, " is not 0 or 1"));
  e->ok = ok == 1;
  WIRE_RETURN_IF_ERROR(r.Str("worker_event fence", &e->fence));
  WIRE_RETURN_IF_ERROR(r.Str("worker_event namespace", &e->ns));
  return absl::OkStatus();
}

absl::StatusOr<FrameBody> DecodeWorkerEventsBody(Reader& r) {
  WorkerEventBatch batch;
  uint32_t n = 0;
  WIRE_RETURN_IF_ERROR(r.Count("worker_event count", kMinWorkerEventBytes, &n));
  batch.events.resize(n);
  for (WorkerEventRecord& e : batch.events) {
    WIRE_RETURN_IF_ERROR(DecodeWorkerEvent(r, &e));
  }
  return FrameBody(std::move(batch));
}

absl::StatusOr<FrameBody> DecodeLayerStoredBody(Reader& r) {
  LayerStoredRequest req;
  uint32_t n = 0;
  WIRE_RETURN_IF_ERROR(r.U64("layer_stored request_id", &req.request_id));
  WIRE_RETURN_IF_ERROR(r.Str("layer_stored namespace", &req.ns));
  WIRE_RETURN_IF_ERROR(r.U32("layer_stored rank", &req.rank));
  WIRE_RETURN_IF_ERROR(r.U32("layer_stored step", &req.step));
  WIRE_RETURN_IF_ERROR(r.Count("layer_stored op count", kOpIdBytes, &n));
  req.ops.resize(n);
  for (uint64_t& op : req.ops) {
    WIRE_RETURN_IF_ERROR(r.U64("layer_stored op", &op));
  }
  return FrameBody(std::move(req));
}

absl::StatusOr<FrameBody> DecodeLayerStoredAckBody(Reader& r) {
  LayerStoredAck ack;
  uint8_t code = 0;
  std::string message;
  WIRE_RETURN_IF_ERROR(r.U64("layer_stored_ack request_id", &ack.request_id));
  WIRE_RETURN_IF_ERROR(r.U8("layer_stored_ack status code", &code));
  if (code > kMaxStatusCode) {
    return r.Bad(absl::StrCat("layer_stored_ack status code ", code,
                              " is not an absl::StatusCode"));
  }
  WIRE_RETURN_IF_ERROR(r.Str("layer_stored_ack status message", &message));
  if (code == 0 && !message.empty()) {
    return r.Bad("layer_stored_ack: an OK status carries a message");
  }
  ack.status = absl::Status(static_cast<absl::StatusCode>(code), message);
  return FrameBody(std::move(ack));
}

// ---- End of kinds 6-8 ----

// ---- Kinds 9-10 (the pool-accounting digest) ----

absl::Status DecodeTallies(Reader& r, std::vector<RankTally>* ranks) {
  uint32_t n = 0;
  WIRE_RETURN_IF_ERROR(r.Count("digest rank count", kRankTallyBytes, &n));
  if (n > kMaxDigestRanks) {
    return r.Bad(
        absl::StrCat("digest rank count ", n, " is over ", kMaxDigestRanks));
  }
  ranks->resize(n);
  for (RankTally& t : *ranks) {
    WIRE_RETURN_IF_ERROR(r.U32("digest rank", &t.rank));
    WIRE_RETURN_IF_ERROR(
        r.U64("digest device_pages_per_rank", &t.device_pages_per_rank));
    WIRE_RETURN_IF_ERROR(
        r.U64("digest host_pages_per_rank", &t.host_pages_per_rank));
    WIRE_RETURN_IF_ERROR(r.U64("digest copies_d2h", &t.copies_d2h));
    WIRE_RETURN_IF_ERROR(r.U64("digest copies_h2d", &t.copies_h2d));
    WIRE_RETURN_IF_ERROR(r.U64("digest pages_d2h", &t.pages_d2h));
    WIRE_RETURN_IF_ERROR(r.U64("digest pages_h2d", &t.pages_h2d));
    WIRE_RETURN_IF_ERROR(r.U64("digest refused", &t.refused));
    WIRE_RETURN_IF_ERROR(r.U64("digest hash", &t.hash));
  }
  return absl::OkStatus();
}

absl::StatusOr<FrameBody> DecodeDigestBody(Reader& r) {
  Digest d;
  WIRE_RETURN_IF_ERROR(r.U64("digest tasks_frames", &d.tasks_frames));
  WIRE_RETURN_IF_ERROR(DecodeTallies(r, &d.ranks));
  return FrameBody(std::move(d));
}

absl::StatusOr<FrameBody> DecodeDigestResultBody(Reader& r) {
  DigestResult d;
  uint8_t match = 0;
  WIRE_RETURN_IF_ERROR(r.U64("digest_result tasks_frames", &d.tasks_frames));
  WIRE_RETURN_IF_ERROR(r.U8("digest_result match", &match));
  if (match > 1) {
    return r.Bad(absl::StrCat("digest_result match ", match, " is not 0 or 1"));
  }
  d.match = match == 1;
  WIRE_RETURN_IF_ERROR(DecodeTallies(r, &d.ranks));
  return FrameBody(std::move(d));
}

// ---- End of kinds 9-10 ----

absl::StatusOr<FrameBody> DecodeBody(FrameKind kind, Reader& r) {
  switch (kind) {
    case FrameKind::kHello:
    case FrameKind::kHeartbeat: {
      uint64_t t = 0;
      uint32_t member = 0;
      WIRE_RETURN_IF_ERROR(r.U64("sender_time_ns", &t));
      WIRE_RETURN_IF_ERROR(r.U32("member_index", &member));
      if (kind == FrameKind::kHello) {
        return FrameBody(Hello{static_cast<int64_t>(t), member});
      }
      return FrameBody(Heartbeat{static_cast<int64_t>(t), member});
    }
    case FrameKind::kTasks: {
      TaskBatch batch;
      uint32_t n = 0;
      WIRE_RETURN_IF_ERROR(r.Count("task count", kMinTaskBytes, &n));
      batch.tasks.resize(n);
      for (TransferTask& task : batch.tasks) {
        WIRE_RETURN_IF_ERROR(DecodeTask(r, &task));
      }
      return FrameBody(std::move(batch));
    }
    case FrameKind::kStepDones: {
      StepDoneBatch batch;
      uint32_t n = 0;
      WIRE_RETURN_IF_ERROR(r.Count("step_done count", kMinStepDoneBytes, &n));
      batch.dones.resize(n);
      for (StepDone& done : batch.dones) {
        WIRE_RETURN_IF_ERROR(DecodeStepDone(r, &done));
      }
      return FrameBody(std::move(batch));
    }
    case FrameKind::kBye: {
      Bye bye;
      WIRE_RETURN_IF_ERROR(r.Str("bye reason", &bye.reason));
      return FrameBody(std::move(bye));
    }
    case FrameKind::kWorkerEvents:
      return DecodeWorkerEventsBody(r);
    case FrameKind::kLayerStored:
      return DecodeLayerStoredBody(r);
    case FrameKind::kLayerStoredAck:
      return DecodeLayerStoredAckBody(r);
    case FrameKind::kDigest:
      return DecodeDigestBody(r);
    case FrameKind::kDigestResult:
      return DecodeDigestResultBody(r);
  }
  return absl::DataLossError("unknown group frame kind");
}

bool SameStatus(const absl::Status& a, const absl::Status& b) {
  return a.code() == b.code() && a.message() == b.message();
}

bool SameCopy(const RankCopy& a, const RankCopy& b) {
  return a.rank == b.rank && a.wait_fence == b.wait_fence &&
         a.device_pages == b.device_pages && a.host_pages == b.host_pages;
}

}  // namespace

std::string FrameKindName(uint8_t kind) {
  switch (kind) {
    case static_cast<uint8_t>(FrameKind::kHello):
      return "hello";
    case static_cast<uint8_t>(FrameKind::kHeartbeat):
      return "heartbeat";
    case static_cast<uint8_t>(FrameKind::kTasks):
      return "tasks";
    case static_cast<uint8_t>(FrameKind::kStepDones):
      return "step_dones";
    case static_cast<uint8_t>(FrameKind::kBye):
      return "bye";
    case static_cast<uint8_t>(FrameKind::kWorkerEvents):
      return "worker_events";
    case static_cast<uint8_t>(FrameKind::kLayerStored):
      return "layer_stored";
    case static_cast<uint8_t>(FrameKind::kLayerStoredAck):
      return "layer_stored_ack";
    case static_cast<uint8_t>(FrameKind::kDigest):
      return "digest";
    case static_cast<uint8_t>(FrameKind::kDigestResult):
      return "digest_result";
    default:
      return absl::StrCat("kind ", kind);
  }
}

FrameKind KindOf(const FrameBody& body) {
  return static_cast<FrameKind>(body.index() + 1);
}

std::string EncodeFrame(uint64_t epoch, uint64_t seq, const FrameBody& body) {
  std::string out;
  LeWriter w(&out);
  w.U8(kWireVersion);
  w.U8(static_cast<uint8_t>(KindOf(body)));
  w.U64(epoch);
  w.U64(seq);
  std::visit(BodyEncoder{w}, body);
  return out;
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::string_view frame) {
  FrameHeader header;
  uint8_t version = 0;
  uint8_t kind = 0;
  LeReader in(frame);
  if (!in.U8(&version) || !in.U8(&kind) || !in.U64(&header.epoch) ||
      !in.U64(&header.seq)) {
    return absl::DataLossError(absl::StrCat("group frame of ", frame.size(),
                                            " bytes is shorter than its ",
                                            kFrameHeaderBytes, "-byte header"));
  }
  if (version != kWireVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("group frame version ", version, "; this daemon speaks ",
                     kWireVersion));
  }
  if (kind < static_cast<uint8_t>(FrameKind::kHello) ||
      kind > static_cast<uint8_t>(FrameKind::kDigestResult)) {
    return absl::DataLossError(absl::StrCat("unknown group frame kind ", kind));
  }
  header.version = version;
  header.kind = static_cast<FrameKind>(kind);
  return header;
}

absl::StatusOr<Frame> DecodeFrame(absl::string_view frame) {
  absl::StatusOr<FrameHeader> header = DecodeFrameHeader(frame);
  if (!header.ok()) return header.status();
  Reader r(frame.substr(kFrameHeaderBytes));
  absl::StatusOr<FrameBody> body = DecodeBody(header->kind, r);
  if (!body.ok()) return body.status();
  if (r.remaining() != 0) {
    return r.Bad(absl::StrCat(r.remaining(), " trailing bytes after a ",
                              FrameKindName(static_cast<uint8_t>(header->kind)),
                              " body"));
  }
  return Frame{*header, *std::move(body)};
}

size_t EncodedRankCopyBytes(const RankCopy& copy) {
  return 4 + 8 + PagesBytes(copy.device_pages) + PagesBytes(copy.host_pages);
}

size_t EncodedTaskBytes(const TransferTask& task) {
  size_t n = kTaskFixedBytes;
  for (const RankCopy& copy : task.ranks) n += EncodedRankCopyBytes(copy);
  return n;
}

size_t EncodedStepDoneBytes(const StepDone& done) {
  const size_t message =
      WireCode(done.status) == 0 ? 0 : done.status.message().size();
  return kMinStepDoneBytes + message + done.fence.size();
}

bool SameTask(const TransferTask& a, const TransferTask& b) {
  if (a.op_id != b.op_id || a.direction != b.direction || a.step != b.step ||
      a.ranks.size() != b.ranks.size()) {
    return false;
  }
  for (size_t i = 0; i < a.ranks.size(); ++i) {
    if (!SameCopy(a.ranks[i], b.ranks[i])) return false;
  }
  return true;
}

bool SameStepDone(const StepDone& a, const StepDone& b) {
  return a.op_id == b.op_id && a.direction == b.direction && a.rank == b.rank &&
         a.step == b.step && SameStatus(a.status, b.status) &&
         a.bytes == b.bytes && a.fence == b.fence;
}

size_t EncodedWorkerEventBytes(const WorkerEventRecord& event) {
  return kMinWorkerEventBytes + event.fence.size() + event.ns.size();
}

bool SameFrame(const Frame& a, const Frame& b) {
  if (!(a.header == b.header) || a.body.index() != b.body.index()) {
    return false;
  }
  // Kinds 9-10.
  if (const auto* x = std::get_if<Digest>(&a.body)) {
    return *x == std::get<Digest>(b.body);
  }
  if (const auto* x = std::get_if<DigestResult>(&a.body)) {
    return *x == std::get<DigestResult>(b.body);
  }
  // Kinds 6-8.
  if (const auto* x = std::get_if<WorkerEventBatch>(&a.body)) {
    return *x == std::get<WorkerEventBatch>(b.body);
  }
  if (const auto* x = std::get_if<LayerStoredRequest>(&a.body)) {
    return *x == std::get<LayerStoredRequest>(b.body);
  }
  if (const auto* x = std::get_if<LayerStoredAck>(&a.body)) {
    const auto& y = std::get<LayerStoredAck>(b.body);
    return x->request_id == y.request_id && SameStatus(x->status, y.status);
  }
  if (const auto* x = std::get_if<TaskBatch>(&a.body)) {
    const auto& y = std::get<TaskBatch>(b.body);
    if (x->tasks.size() != y.tasks.size()) return false;
    for (size_t i = 0; i < x->tasks.size(); ++i) {
      if (!SameTask(x->tasks[i], y.tasks[i])) return false;
    }
    return true;
  }
  if (const auto* x = std::get_if<StepDoneBatch>(&a.body)) {
    const auto& y = std::get<StepDoneBatch>(b.body);
    if (x->dones.size() != y.dones.size()) return false;
    for (size_t i = 0; i < x->dones.size(); ++i) {
      if (!SameStepDone(x->dones[i], y.dones[i])) return false;
    }
    return true;
  }
  if (const auto* x = std::get_if<Hello>(&a.body)) {
    return *x == std::get<Hello>(b.body);
  }
  if (const auto* x = std::get_if<Heartbeat>(&a.body)) {
    return *x == std::get<Heartbeat>(b.body);
  }
  return std::get<Bye>(a.body) == std::get<Bye>(b.body);
}

}  // namespace hicache::group
