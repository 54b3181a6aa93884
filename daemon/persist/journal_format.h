#pragma once

// The on-disk format of the host-tier journal (docs/hot-restart.md §3).
//
// File:   FileHeader (16 bytes) then records, the first of which must be a
//         Geometry record.
//   FileHeader: magic "HCJOURNL" (8 bytes), version u32 LE, reserved u32 (0).
// Record: length u32 LE (payload bytes) | type u8 | payload | XXH3-64 u64 LE
//         of the length, type and payload bytes. Every integer is
//         little-endian; strings are u32 length + bytes (kept as bytes: no
//         UTF-8 check); lists are u32 count + elements.
//   Geometry: page_size u32, cp_size u32, kv_fingerprint u64,
//             host_layout string, host_pages_per_rank i64, instance string.
//   Put:      persist_id u64, parent_persist_id u64, namespace string,
//             logical_len i64, page_owners (u32 list), rank count u32, then
//             per rank: pages (i64 list), checksums (u64 list).
//             No tokens: a node's key lives with its pages in shared memory
//             (PageKeyStore), and each page's checksum covers its tokens
//             (PageRecordChecksum), so the journal holds only the index.
//             Version 1 carried the edge tokens in the record; a version 1
//             journal is refused (a cold start).
//   Drop:     persist_id u64.
//   Clean:    empty (written by Flush(clean) on SIGTERM; informational).
//
// Decoders take untrusted bytes: every length and count is checked against
// the bytes that remain before anything is allocated, a payload must be
// consumed exactly, and nothing crashes. Structural checks that need the
// geometry (ranks, owners, page ranges, shapes) are ValidatePut().

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"

namespace hicache::persist {

inline constexpr char kJournalMagic[8] = {'H', 'C', 'J', 'O',
                                          'U', 'R', 'N', 'L'};
inline constexpr uint32_t kJournalVersion = 2;
inline constexpr size_t kFileHeaderSize = 16;
// length u32 + type u8.
inline constexpr size_t kFramePrefixSize = 5;
inline constexpr size_t kFrameChecksumSize = 8;
inline constexpr size_t kFrameOverhead = kFramePrefixSize + kFrameChecksumSize;
// The largest payload a frame may declare (a Put of ~4M pages at C = 1). A
// larger length is corruption, so a hostile length never makes the reader
// wait for or allocate gigabytes.
inline constexpr uint32_t kMaxPayloadSize = 64u << 20;

// The most ranks (cp_size) a Geometry or a Put may name: bounds what a
// hostile rank count can make the decoder allocate (two empty lists a rank).
inline constexpr uint32_t kMaxCpSize = 1024;

enum class RecordType : uint8_t {
  kGeometry = 1,
  kPut = 2,
  kDrop = 3,
  kClean = 4,
};

// The geometry a journal belongs to. Recovery refuses a journal whose header
// differs from the daemon's in any field (CompareGeometry names it).
struct JournalGeometry {
  uint32_t page_size = 0;       // Tokens per page.
  uint32_t cp_size = 0;         // Ranks.
  uint64_t kv_fingerprint = 0;  // Hash of the KV byte geometry.
  std::string host_layout;      // e.g. "layer_first".
  int64_t host_pages_per_rank = 0;
  std::string instance;  // The daemon instance id.

  bool operator==(const JournalGeometry&) const = default;
};

// One host node's durable description (a Put record).
struct PutRecord {
  uint64_t persist_id = 0;         // Never 0; never reused in a journal.
  uint64_t parent_persist_id = 0;  // 0: the namespace root.
  std::string name_space;          // Bytes, not necessarily UTF-8.
  int64_t logical_len = 0;         // Tokens of the edge key from the parent.
  std::vector<uint32_t> page_owners;             // Rank of each logical page.
  std::vector<std::vector<int64_t>> host_pages;  // [rank][i]
  // Same shape as host_pages: PageRecordChecksum of each page (its KV bytes
  // and its tokens).
  std::vector<std::vector<uint64_t>> checksums;

  bool operator==(const PutRecord&) const = default;
};

// "HCJOURNL", version, reserved.
std::string EncodeFileHeader();
// DATA_LOSS for a short buffer or wrong magic; FAILED_PRECONDITION for
// another version (the message names both).
absl::Status CheckFileHeader(absl::string_view bytes);

// Appends one framed record (length, type, payload, checksum) to *out.
// INVALID_ARGUMENT (nothing appended) for a payload over kMaxPayloadSize.
absl::Status AppendFrame(RecordType type, absl::string_view payload,
                         std::string* out);

// Payload encoders. EncodePut checks the shape it can check without the
// geometry (persist_id != 0, parent != self, as many checksum lists as page
// lists and each as long as its page list, sizes that fit the format):
// INVALID_ARGUMENT naming the field otherwise.
std::string EncodeGeometryPayload(const JournalGeometry& geometry);
absl::StatusOr<std::string> EncodePutPayload(const PutRecord& put);
std::string EncodeDropPayload(uint64_t persist_id);

// Whole framed records.
absl::StatusOr<std::string> EncodeGeometryRecord(const JournalGeometry& g);
absl::StatusOr<std::string> EncodePutRecord(const PutRecord& put);
std::string EncodeDropRecord(uint64_t persist_id);
std::string EncodeCleanRecord();

// Payload decoders (untrusted input): DATA_LOSS naming what is wrong. A
// Geometry must have page_size > 0, 0 < cp_size <= kMaxCpSize and
// host_pages_per_rank >= 0; a Put at most kMaxCpSize ranks.
absl::StatusOr<JournalGeometry> DecodeGeometryPayload(absl::string_view p);
absl::StatusOr<PutRecord> DecodePutPayload(absl::string_view p);
absl::StatusOr<uint64_t> DecodeDropPayload(absl::string_view p);
// The first two fields of a Put payload without decoding the rest.
absl::Status PeekPutIds(absl::string_view p, uint64_t* persist_id,
                        uint64_t* parent_persist_id);

// page_size > 0, 0 < cp_size <= kMaxCpSize, host_pages_per_rank >= 0:
// INVALID_ARGUMENT naming the field otherwise.
absl::Status ValidateGeometry(const JournalGeometry& geometry);

// One page of a Put, in the node's position order: `position` in the node,
// its owner `rank`, its `index` in that rank's lists (host_pages[rank] and
// checksums[rank]: a rank's pages are listed in position order) and how
// many of the node's tokens it holds (page_size, or fewer for the last).
struct PutPage {
  size_t position = 0;
  uint32_t rank = 0;
  size_t index = 0;
  size_t tokens = 0;
};
// Calls `fn` for each page of `put` in position order. False (after the
// pages before it) at an owner without a page list or past its list's end:
// a record that fails ValidatePut; true otherwise.
bool ForEachPage(const PutRecord& put, uint32_t page_size,
                 absl::FunctionRef<void(const PutPage&)> fn);

// Checks a decoded Put against the geometry (which must pass
// ValidateGeometry, else DATA_LOSS): persist_id != 0 and != parent,
// logical_len > 0, page_owners has ceil(logical_len / page_size) entries each
// < cp_size, cp_size page lists, list r as long as the pages rank r owns,
// every page in [0, host_pages_per_rank), checksums shaped like pages.
// DATA_LOSS naming the field otherwise.
absl::Status ValidatePut(const PutRecord& put, const JournalGeometry& g);

// Field-by-field comparison: OK if equal, else FAILED_PRECONDITION naming
// each differing field with both values ("page_size: journal 16, daemon 32").
absl::Status CompareGeometry(const JournalGeometry& journal,
                             const JournalGeometry& daemon);

// One frame found in a buffer.
struct Frame {
  RecordType type = RecordType::kGeometry;
  absl::string_view payload;  // Points into the scanned buffer.
  size_t size = 0;            // Whole frame, overhead included.
};

// Parses the frame at bytes[0..]. OUT_OF_RANGE when the buffer ends inside
// the frame (a torn tail); DATA_LOSS for a length over kMaxPayloadSize, a
// checksum mismatch or an unknown type. Never reads past `bytes`.
absl::StatusOr<Frame> ParseFrame(absl::string_view bytes);

}  // namespace hicache::persist
