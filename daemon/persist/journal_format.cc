#include "daemon/persist/journal_format.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace hicache::persist {
namespace {

// Little-endian encoding into a string.
void PutU8(std::string* out, uint8_t v) {
  out->push_back(static_cast<char>(v));
}
void PutU32(std::string* out, uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out->append(b, 4);
}
void PutU64(std::string* out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out->append(b, 8);
}
void PutString(std::string* out, absl::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s.data(), s.size());
}

// u32 count, then the elements. On a little-endian host the in-memory
// representation is the wire format: one memcpy.
template <typename T>
void PutArray(std::string* out, const std::vector<T>& v) {
  static_assert(std::is_integral_v<T> && (sizeof(T) == 4 || sizeof(T) == 8));
  PutU32(out, static_cast<uint32_t>(v.size()));
  if constexpr (std::endian::native == std::endian::little) {
    out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  } else {
    for (T x : v) {
      if constexpr (sizeof(T) == 4) {
        PutU32(out, static_cast<uint32_t>(x));
      } else {
        PutU64(out, static_cast<uint64_t>(x));
      }
    }
  }
}

uint32_t LoadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint64_t LoadU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// Bounds-checked little-endian reader over untrusted bytes.
class Cursor {
 public:
  explicit Cursor(absl::string_view bytes) : bytes_(bytes) {}
  size_t remaining() const { return bytes_.size() - pos_; }

  bool U32(uint32_t* v) {
    if (remaining() < 4) return false;
    *v = LoadU32(bytes_.data() + pos_);
    pos_ += 4;
    return true;
  }
  bool U64(uint64_t* v) {
    if (remaining() < 8) return false;
    *v = LoadU64(bytes_.data() + pos_);
    pos_ += 8;
    return true;
  }
  bool I64(int64_t* v) {
    uint64_t u;
    if (!U64(&u)) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }
  bool String(std::string* s) {
    uint32_t n;
    if (!U32(&n) || remaining() < n) return false;
    s->assign(bytes_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  // A u32 count of `element_size`-byte elements that must fit the rest.
  bool Count(size_t element_size, uint32_t* n) {
    if (!U32(n)) return false;
    return static_cast<uint64_t>(*n) * element_size <= remaining();
  }
  // A u32 count then that many little-endian integers (the PutArray format).
  template <typename T>
  bool Array(std::vector<T>* v) {
    static_assert(std::is_integral_v<T> && (sizeof(T) == 4 || sizeof(T) == 8));
    uint32_t n;
    if (!Count(sizeof(T), &n)) return false;
    v->resize(n);
    const char* p = bytes_.data() + pos_;
    if constexpr (std::endian::native == std::endian::little) {
      // An empty vector's data() may be null: memcpy(null, ..., 0) is UB.
      if (n > 0) std::memcpy(v->data(), p, size_t{n} * sizeof(T));
    } else {
      for (uint32_t i = 0; i < n; ++i) {
        if constexpr (sizeof(T) == 4) {
          (*v)[i] = static_cast<T>(LoadU32(p + 4 * size_t{i}));
        } else {
          (*v)[i] = static_cast<T>(LoadU64(p + 8 * size_t{i}));
        }
      }
    }
    pos_ += size_t{n} * sizeof(T);
    return true;
  }

 private:
  absl::string_view bytes_;
  size_t pos_ = 0;
};

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("journal record: ", what));
}

uint64_t FrameChecksum(const char* start, size_t len) {
  return XXH3_64bits(start, len);
}

}  // namespace

std::string EncodeFileHeader() {
  std::string out(kJournalMagic, sizeof(kJournalMagic));
  PutU32(&out, kJournalVersion);
  PutU32(&out, 0);
  return out;
}

absl::Status CheckFileHeader(absl::string_view bytes) {
  if (bytes.size() < kFileHeaderSize) {
    return absl::DataLossError(
        absl::StrCat("journal file header: ", bytes.size(), " bytes, need ",
                     kFileHeaderSize));
  }
  if (std::memcmp(bytes.data(), kJournalMagic, sizeof(kJournalMagic)) != 0) {
    return absl::DataLossError("journal file header: bad magic");
  }
  const uint32_t version = LoadU32(bytes.data() + 8);
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
  PutU32(out, static_cast<uint32_t>(payload.size()));
  PutU8(out, static_cast<uint8_t>(type));
  out->append(payload.data(), payload.size());
  PutU64(out,
         FrameChecksum(out->data() + start, kFramePrefixSize + payload.size()));
  return absl::OkStatus();
}

std::string EncodeGeometryPayload(const JournalGeometry& g) {
  std::string p;
  PutU32(&p, g.page_size);
  PutU32(&p, g.cp_size);
  PutU64(&p, g.kv_fingerprint);
  PutString(&p, g.host_layout);
  PutU64(&p, static_cast<uint64_t>(g.host_pages_per_rank));
  PutString(&p, g.instance);
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
  if (put.name_space.size() > kMaxCount ||
      put.page_owners.size() > kMaxCount) {
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
  PutU64(p, put.persist_id);
  PutU64(p, put.parent_persist_id);
  PutString(p, put.name_space);
  PutU64(p, static_cast<uint64_t>(put.logical_len));
  PutArray(p, put.page_owners);
  PutU32(p, static_cast<uint32_t>(put.host_pages.size()));
  for (size_t r = 0; r < put.host_pages.size(); ++r) {
    PutArray(p, put.host_pages[r]);
    PutArray(p, put.checksums[r]);
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
  PutU64(&p, persist_id);
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
  PutU32(&out, static_cast<uint32_t>(*size));
  PutU8(&out, static_cast<uint8_t>(RecordType::kPut));
  AppendPutPayload(put, &out);
  PutU64(&out, FrameChecksum(out.data(), out.size()));
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
  Cursor c(p);
  JournalGeometry g;
  uint64_t pages;
  if (!c.U32(&g.page_size) || !c.U32(&g.cp_size) || !c.U64(&g.kv_fingerprint) ||
      !c.String(&g.host_layout) || !c.U64(&pages) || !c.String(&g.instance)) {
    return Corrupt("Geometry truncated");
  }
  if (c.remaining() != 0) return Corrupt("Geometry has trailing bytes");
  g.host_pages_per_rank = static_cast<int64_t>(pages);
  if (absl::Status s = ValidateGeometry(g); !s.ok())
    return Corrupt(s.message());
  return g;
}

absl::Status PeekPutIds(absl::string_view p, uint64_t* persist_id,
                        uint64_t* parent_persist_id) {
  Cursor c(p);
  if (!c.U64(persist_id) || !c.U64(parent_persist_id)) {
    return Corrupt("Put truncated in its ids");
  }
  return absl::OkStatus();
}

absl::StatusOr<PutRecord> DecodePutPayload(absl::string_view p) {
  Cursor c(p);
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
  Cursor c(p);
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
               .tokens = static_cast<size_t>(std::clamp<int64_t>(
                   left, 0, int64_t{page_size}))});
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
  if (bytes.size() < kFramePrefixSize) {
    return absl::OutOfRangeError("journal ends inside a record header");
  }
  const uint32_t length = LoadU32(bytes.data());
  if (length > kMaxPayloadSize) {
    return absl::DataLossError(absl::StrCat("journal record length ", length,
                                            " exceeds ", kMaxPayloadSize));
  }
  const size_t total = kFrameOverhead + static_cast<size_t>(length);
  if (bytes.size() < total) {
    return absl::OutOfRangeError(
        absl::StrCat("journal ends inside a record of ", total, " bytes (",
                     bytes.size(), " left)"));
  }
  const uint64_t stored = LoadU64(bytes.data() + kFramePrefixSize + length);
  if (stored != FrameChecksum(bytes.data(), kFramePrefixSize + length)) {
    return absl::DataLossError("journal record checksum mismatch");
  }
  const uint8_t type = static_cast<uint8_t>(bytes[4]);
  if (type < static_cast<uint8_t>(RecordType::kGeometry) ||
      type > static_cast<uint8_t>(RecordType::kClean)) {
    return absl::DataLossError(
        absl::StrCat("journal record of unknown type ", type));
  }
  Frame frame;
  frame.type = static_cast<RecordType>(type);
  frame.payload = bytes.substr(kFramePrefixSize, length);
  frame.size = total;
  return frame;
}

}  // namespace hicache::persist
