#pragma once

// The token ids of every host (L2) page, kept in shared memory next to the
// host pools so that they survive the daemon as the KV bytes do (hot
// restart, docs/hot-restart.md §3). The durable journal then records only
// the index (ids, owners, pages, checksums), never the keys: a key is read
// back from here at recovery, and each page's recorded checksum covers its
// tokens as well as its KV bytes (PageRecordChecksum), so a key that does not
// belong to the page is caught like a torn page is.
//
// Layout: one segment per rank, "<prefix>-keys-r<rank>-g<fingerprint>" (see
// persistent_host_segment.h), of host_pages_per_rank slots; slot p holds the
// page_size token ids (int32, native byte order) of host page p of that rank.
// The last page of a node may hold fewer tokens than page_size; the rest of
// its slot is left as it was and is never read for that page.
//
// The store does not know who owns a page. Its one writer (the host-tier
// recorder's worker) writes the slots of each commit it records, in the
// tree's order, so a slot holds the tokens of the last node recorded with
// that page (it may write a commit's key after the page was reused, for a
// commit it then discards: the next owner's key is written before that
// owner's record is journaled; docs/hot-restart.md §4).
//
// Not thread-safe for the same slot; distinct slots may be written and read
// concurrently.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/pool/shm_pool.h"

namespace hicache {

class PageKeyStore {
 public:
  struct Options {
    std::string prefix;   // The instance's shm prefix ("/hicache-<id>").
    Rank num_ranks = 0;   // Segments for ranks [0, num_ranks).
    int64_t pages_per_rank = 0;
    uint32_t page_size = 0;  // Tokens per page.
    uint64_t fingerprint = 0;  // KvGeometry::HostFingerprint.
  };

  // Attaches every rank's segment of this fingerprint that exists with the
  // right size, or creates it (kept: it survives the daemon), and faults its
  // memory in (writes never page-fault later); segments of
  // other fingerprints are removed (`removed` names them). INVALID_ARGUMENT
  // for num_ranks < 1, pages_per_rank < 0, page_size == 0 or a size over
  // 2^40 bytes a rank; errors of OpenPersistentSegment otherwise. Call it
  // while holding the instance (ShmInstance::Acquire).
  static absl::StatusOr<std::unique_ptr<PageKeyStore>> Open(
      const Options& options);

  // A store in private memory (zeroed), never attached: for tests and
  // fuzzers. INVALID_ARGUMENT as Open.
  static absl::StatusOr<std::unique_ptr<PageKeyStore>> InMemory(
      Rank num_ranks, int64_t pages_per_rank, uint32_t page_size);

  // Whether every rank's segment was attached (a previous daemon's keys).
  bool attached() const { return attached_; }
  const std::vector<std::string>& removed() const { return removed_; }
  uint32_t page_size() const { return page_size_; }
  int64_t pages_per_rank() const { return pages_per_rank_; }
  Rank num_ranks() const { return static_cast<Rank>(slots_.size()); }

  // Writes `tokens` (at most page_size) to the slot of (rank, page).
  // INVALID_ARGUMENT (nothing written) for a rank, page or length out of
  // range.
  absl::Status Write(Rank rank, int64_t page, absl::Span<const int32_t> tokens);
  // Writes one node's key to its pages' slots in one call (the host-tier
  // recorder's worker does it for every commit it records, so the per-page
  // cost matters): key_pages[i], the node's logical page i, goes to the slot
  // of rank owners[i], page pages[owners[i]][n], where n counts the pages of
  // that rank before position i (a rank's pages listed in position order, as
  // CpHostMeta and the journal's Put list them). Everything is checked
  // before a byte is written: INVALID_ARGUMENT, nothing written, if
  // key_pages and owners differ in length, an owner is past num_ranks() or
  // pages.size() or has no page left in its list, a key page holds more
  // than page_size tokens, or a page is out of range.
  absl::Status WriteNode(absl::Span<const uint32_t> owners,
                         absl::Span<const std::vector<int64_t>> pages,
                         absl::Span<const absl::Span<const int32_t>> key_pages);
  // The first `count` tokens of the slot of (rank, page); INVALID_ARGUMENT
  // for a rank, page or count out of range. Valid while the store lives.
  absl::StatusOr<absl::Span<const int32_t>> Read(Rank rank, int64_t page,
                                                 size_t count) const;

 private:
  PageKeyStore(uint32_t page_size, int64_t pages_per_rank)
      : page_size_(page_size), pages_per_rank_(pages_per_rank) {}
  // INVALID_ARGUMENT unless every argument is at least 1 and a rank's slots
  // fit 2^40 bytes; *bytes: a rank's size.
  static absl::Status CheckShape(Rank num_ranks, int64_t pages_per_rank,
                                 uint32_t page_size, uint64_t* bytes);
  absl::Status Check(Rank rank, int64_t page, size_t count) const;
  int32_t* Slot(Rank rank, int64_t page) const;

  const uint32_t page_size_;
  const int64_t pages_per_rank_;
  std::vector<int32_t*> slots_;  // By rank: the first slot.
  std::vector<std::unique_ptr<ShmPool>> segments_;  // Open: by rank.
  std::vector<std::vector<int32_t>> memory_;        // InMemory: by rank.
  bool attached_ = false;
  std::vector<std::string> removed_;
};

// The checksum a journal records for one host page: the XXH3-64 of its KV
// bytes (page_checksum.h) mixed with the XXH3-64 of the token ids it holds
// (as int32 native bytes). A page verifies only if both its bytes and its
// key are the ones recorded. KvChecksumFor inverts the mix for a key: the KV
// checksum a page with these tokens must have.
uint64_t PageTokensChecksum(absl::Span<const int32_t> tokens);
inline uint64_t PageRecordChecksum(uint64_t kv_checksum,
                                   absl::Span<const int32_t> tokens) {
  return kv_checksum ^ PageTokensChecksum(tokens);
}
inline uint64_t KvChecksumFor(uint64_t record_checksum,
                              absl::Span<const int32_t> tokens) {
  return record_checksum ^ PageTokensChecksum(tokens);
}

}  // namespace hicache
