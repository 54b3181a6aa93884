#include "daemon/persist/journal_format.h"

#include <xxhash.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/core/le_bytes.h"

namespace hicache::persist {
namespace {

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("journal record: ", what));
}

uint64_t FrameChecksum(const char* start, size_t len) {
  return XXH3_64bits(start, len);
}

}  // namespace

std::string EncodeFileHeader() {
  std::string out;
  LeWriter w(&out);
  w.Bytes(absl::string_view(kJournalMagic, sizeof(kJournalMagic)));
  w.U32(kJournalVersion);
  w.U32(0);
  return out;
}

absl::Status CheckFileHeader(absl::string_view bytes) {
  if (bytes.size() < kFileHeaderSize) {
    return absl::DataLossError(
        absl::StrCat("journal file header: ", bytes.size(), " bytes, need ",
                     kFileHeaderSize));
  }
  LeReader in(bytes);
  absl::string_view magic;
  uint32_t version = 0;
  // The size was checked: these reads cannot fail.
  (void)in.Bytes(sizeof(kJournalMagic), &magic);
  (void)in.U32(&version);
  if (magic != absl::string_view(kJournalMagic, sizeof(kJournalMagic))) {
    return absl::DataLossError("journal file header: bad magic");
  }
  if (version != kJournalVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "journal version ", version, ", this daemon reads ", kJournalVersion));
  }
  return absl::OkStatus();
}

absl::Status AppendFrame(RecordType type, absl::string_view payload,
                         std::string* out) {
  if (payload.size() > kMaxPayloadSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("journal record payload of ", payload.size(),
                     " bytes exceeds ", kMaxPayloadSize));
  }
  const size_t start = out->size();
  out->reserve(start + payload.size() + kFrameOverhead);
  LeWriter w(out);
  w.U32(static_cast<uint32_t>(payload.size()));
  w.U8(static_cast<uint8_t>(type));
  w.Bytes(payload);
  w.U64(FrameChecksum(out->data() + start, kFramePrefixSize + payload.size()));
  return absl::OkStatus();
}

std::string EncodeGeometryPayload(const JournalGeometry& g) {
  std::string p;
  LeWriter w(&p);
  w.U32(g.page_size);
  w.U32(g.cp_size);
  w.U64(g.kv_fingerprint);
  w.String(g.host_layout);
  w.I64(g.host_pages_per_rank);
  w.String(g.instance);
  return p;
}

namespace {

// Checks what EncodePutPayload documents; returns the payload size.
absl::StatusOr<size_t> PutPayloadSize(const PutRecord& put) {
  if (put.persist_id == 0) {
    return absl::InvalidArgumentError("Put: persist_id 0");
  }
  if (put.parent_persist_id == put.persist_id) {
    return absl::InvalidArgumentError("Put: parent_persist_id == persist_id");
  }
  if (put.checksums.size() != put.host_pages.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Put: ", put.checksums.size(), " checksum lists for ",
                     put.host_pages.size(), " page lists"));
  }
  constexpr size_t kMaxCount = std::numeric_limits<uint32_t>::max();
  if (put.name_space.size() > kMaxCount || put.page_owners.size() > kMaxCount) {
    return absl::InvalidArgumentError("Put: a list is too long to encode");
  }
  size_t size = 8 + 8 + 4 + put.name_space.size() + 8 + 4 +
                4 * put.page_owners.size() + 4;
  for (size_t r = 0; r < put.host_pages.size(); ++r) {
    if (put.checksums[r].size() != put.host_pages[r].size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Put: rank ", r, " has ", put.host_pages[r].size(),
                       " pages and ", put.checksums[r].size(), " checksums"));
    }
    size += 8 + 16 * put.host_pages[r].size();
  }
  if (size > kMaxPayloadSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Put: ", size, " bytes exceeds the record limit ", kMaxPayloadSize));
  }
  return size;
}

// Appends the payload of a Put that PutPayloadSize accepted.
void AppendPutPayload(const PutRecord& put, std::string* p) {
  LeWriter w(p);
  w.U64(put.persist_id);
  w.U64(put.parent_persist_id);
  w.String(put.name_space);
  w.I64(put.logical_len);
  w.Array(put.page_owners);
  w.U32(static_cast<uint32_t>(put.host_pages.size()));
  for (size_t r = 0; r < put.host_pages.size(); ++r) {
    w.Array(put.host_pages[r]);
    w.Array(put.checksums[r]);
  }
}

}  // namespace

absl::StatusOr<std::string> EncodePutPayload(const PutRecord& put) {
  absl::StatusOr<size_t> size = PutPayloadSize(put);
  if (!size.ok()) return size.status();
  std::string p;
  p.reserve(*size);
  AppendPutPayload(put, &p);
  return p;
}

std::string EncodeDropPayload(uint64_t persist_id) {
  std::string p;
  LeWriter(&p).U64(persist_id);
  return p;
}

absl::StatusOr<std::string> EncodeGeometryRecord(const JournalGeometry& g) {
  std::string out;
  absl::Status s =
      AppendFrame(RecordType::kGeometry, EncodeGeometryPayload(g), &out);
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<std::string> EncodePutRecord(const PutRecord& put) {
  // The payload is encoded in place, between the frame's prefix and its
  // checksum: one buffer, no copy (this runs on the engine's thread).
  absl::StatusOr<size_t> size = PutPayloadSize(put);
  if (!size.ok()) return size.status();
  std::string out;
  out.reserve(*size + kFrameOverhead);
  LeWriter w(&out);
  w.U32(static_cast<uint32_t>(*size));
  w.U8(static_cast<uint8_t>(RecordType::kPut));
  AppendPutPayload(put, &out);
  w.U64(FrameChecksum(out.data(), out.size()));
  return out;
}

std::string EncodeDropRecord(uint64_t persist_id) {
  std::string out;
  // A Drop payload is 8 bytes: AppendFrame cannot fail.
  (void)AppendFrame(RecordType::kDrop, EncodeDropPayload(persist_id), &out);
  return out;
}

std::string EncodeCleanRecord() {
  std::string out;
  (void)AppendFrame(RecordType::kClean, "", &out);  // Empty: cannot fail.
  return out;
}

absl::Status ValidateGeometry(const JournalGeometry& g) {
  if (g.page_size == 0)
    return absl::InvalidArgumentError("Geometry page_size 0");
  if (g.cp_size == 0 || g.cp_size > kMaxCpSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Geometry cp_size ", g.cp_size, " outside [1, ", kMaxCpSize, "]"));
  }
  if (g.host_pages_per_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Geometry host_pages_per_rank ", g.host_pages_per_rank));
  }
  return absl::OkStatus();
}

absl::StatusOr<JournalGeometry> DecodeGeometryPayload(absl::string_view p) {
  LeReader c(p);
  JournalGeometry g;
  if (!c.U32(&g.page_size) || !c.U32(&g.cp_size) || !c.U64(&g.kv_fingerprint) ||
      !c.String(&g.host_layout) || !c.I64(&g.host_pages_per_rank) ||
      !c.String(&g.instance)) {
    return Corrupt("Geometry truncated");
  }
  if (c.remaining() != 0) return Corrupt("Geometry has trailing bytes");
  if (absl::Status s = ValidateGeometry(g); !s.ok())
    return Corrupt(s.message());
  return g;
}

absl::Status PeekPutIds(absl::string_view p, uint64_t* persist_id,
                        uint64_t* parent_persist_id) {
  LeReader c(p);
  if (!c.U64(persist_id) || !c.U64(parent_persist_id)) {
    return Corrupt("Put truncated in its ids");
  }
  return absl::OkStatus();
}

absl::StatusOr<PutRecord> DecodePutPayload(absl::string_view p) {
  LeReader c(p);
  PutRecord put;
  if (!c.U64(&put.persist_id) || !c.U64(&put.parent_persist_id)) {
    return Corrupt("Put truncated in its ids");
  }
  if (!c.String(&put.name_space)) return Corrupt("Put namespace truncated");
  if (!c.I64(&put.logical_len)) return Corrupt("Put logical_len truncated");
  if (!c.Array(&put.page_owners)) {
    return Corrupt("Put page_owners count does not fit the record");
  }
  uint32_t ranks;
  // Each rank needs at least its two counts.
  if (!c.Count(8, &ranks) || ranks > kMaxCpSize) {
    return Corrupt("Put rank count does not fit");
  }
  put.host_pages.resize(ranks);
  put.checksums.resize(ranks);
  for (uint32_t r = 0; r < ranks; ++r) {
    if (!c.Array(&put.host_pages[r])) {
      return Corrupt(absl::StrCat("Put rank ", r, " page count does not fit"));
    }
    if (!c.Array(&put.checksums[r])) {
      return Corrupt(
          absl::StrCat("Put rank ", r, " checksum count does not fit"));
    }
    if (put.checksums[r].size() != put.host_pages[r].size()) {
      return Corrupt(absl::StrCat("Put rank ", r, ": ",
                                  put.host_pages[r].size(), " pages but ",
                                  put.checksums[r].size(), " checksums"));
    }
  }
  if (c.remaining() != 0) return Corrupt("Put has trailing bytes");
  return put;
}

absl::StatusOr<uint64_t> DecodeDropPayload(absl::string_view p) {
  LeReader c(p);
  uint64_t id;
  if (!c.U64(&id)) return Corrupt("Drop truncated");
  if (c.remaining() != 0) return Corrupt("Drop has trailing bytes");
  if (id == 0) return Corrupt("Drop of persist_id 0");
  return id;
}

bool ForEachPage(const PutRecord& put, uint32_t page_size,
                 absl::FunctionRef<void(const PutPage&)> fn) {
  std::vector<size_t> next(put.host_pages.size(), 0);  // Per rank.
  for (size_t i = 0; i < put.page_owners.size(); ++i) {
    const uint32_t rank = put.page_owners[i];
    if (rank >= next.size() || next[rank] >= put.host_pages[rank].size()) {
      return false;
    }
    const int64_t left =
        put.logical_len - static_cast<int64_t>(i) * int64_t{page_size};
    fn(PutPage{.position = i,
               .rank = rank,
               .index = next[rank]++,
               .tokens = static_cast<size_t>(
                   std::clamp<int64_t>(left, 0, int64_t{page_size}))});
  }
  return true;
}

absl::Status ValidatePut(const PutRecord& put, const JournalGeometry& g) {
  const std::string id = absl::StrCat("Put ", put.persist_id, ": ");
  if (put.persist_id == 0) return Corrupt("Put with persist_id 0");
  if (put.parent_persist_id == put.persist_id) {
    return Corrupt(absl::StrCat(id, "its own parent"));
  }
  if (put.logical_len <= 0) {
    return Corrupt(absl::StrCat(id, "logical_len ", put.logical_len));
  }
  if (absl::Status s = ValidateGeometry(g); !s.ok())
    return Corrupt(s.message());
  const uint64_t pages =
      (static_cast<uint64_t>(put.logical_len) + g.page_size - 1) / g.page_size;
  if (put.page_owners.size() != pages) {
    return Corrupt(absl::StrCat(id, put.page_owners.size(),
                                " page owners for logical_len ",
                                put.logical_len, " (", pages, " pages)"));
  }
  if (put.host_pages.size() != g.cp_size || put.checksums.size() != g.cp_size) {
    return Corrupt(absl::StrCat(id, put.host_pages.size(),
                                " page lists for cp_size ", g.cp_size));
  }
  std::vector<uint64_t> owned(g.cp_size, 0);
  for (uint32_t owner : put.page_owners) {
    if (owner >= g.cp_size) {
      return Corrupt(
          absl::StrCat(id, "owner rank ", owner, " >= cp_size ", g.cp_size));
    }
    ++owned[owner];
  }
  for (uint32_t r = 0; r < g.cp_size; ++r) {
    if (put.host_pages[r].size() != owned[r]) {
      return Corrupt(absl::StrCat(id, "rank ", r, " has ",
                                  put.host_pages[r].size(), " pages but owns ",
                                  owned[r]));
    }
    if (put.checksums[r].size() != put.host_pages[r].size()) {
      return Corrupt(absl::StrCat(id, "rank ", r, " checksums/pages shape"));
    }
    for (int64_t page : put.host_pages[r]) {
      if (page < 0 || page >= g.host_pages_per_rank) {
        return Corrupt(absl::StrCat(id, "rank ", r, " page ", page,
                                    " outside [0, ", g.host_pages_per_rank,
                                    ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CompareGeometry(const JournalGeometry& journal,
                             const JournalGeometry& daemon) {
  std::vector<std::string> diffs;
  auto check = [&diffs](absl::string_view field, const auto& j, const auto& d) {
    if (!(j == d)) {
      diffs.push_back(absl::StrCat(field, ": journal ", j, ", daemon ", d));
    }
  };
  check("page_size", journal.page_size, daemon.page_size);
  check("cp_size", journal.cp_size, daemon.cp_size);
  check("kv_fingerprint", journal.kv_fingerprint, daemon.kv_fingerprint);
  check("host_layout", journal.host_layout, daemon.host_layout);
  check("host_pages_per_rank", journal.host_pages_per_rank,
        daemon.host_pages_per_rank);
  check("instance", journal.instance, daemon.instance);
  if (diffs.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("journal geometry differs: ", absl::StrJoin(diffs, "; ")));
}

absl::StatusOr<Frame> ParseFrame(absl::string_view bytes) {
  LeReader in(bytes);
  uint32_t length = 0;
  uint8_t type = 0;
  if (!in.U32(&length) || !in.U8(&type)) {
    return absl::OutOfRangeError("journal ends inside a record header");
  }
  if (length > kMaxPayloadSize) {
    return absl::DataLossError(absl::StrCat("journal record length ", length,
                                            " exceeds ", kMaxPayloadSize));
  }
  const size_t total = kFrameOverhead + static_cast<size_t>(length);
  absl::string_view payload;
  uint64_t stored = 0;
  if (!in.Bytes(length, &payload) || !in.U64(&stored)) {
    return absl::OutOfRangeError(
        absl::StrCat("journal ends inside a record of ", total, " bytes (",
                     bytes.size(), " left)"));
  }
  if (stored != FrameChecksum(bytes.data(), kFramePrefixSize + length)) {
    return absl::DataLossError("journal record checksum mismatch");
  }
  if (type < static_cast<uint8_t>(RecordType::kGeometry) ||
      type > static_cast<uint8_t>(RecordType::kClean)) {
    return absl::DataLossError(
        absl::StrCat("journal record of unknown type ", type));
  }
  Frame frame;
  frame.type = static_cast<RecordType>(type);
  frame.payload = payload;
  frame.size = total;
  return frame;
}

}  // namespace hicache::persist
