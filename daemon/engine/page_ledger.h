#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "daemon/layout/cp_layout.h"

namespace hicache {

// Who holds an allocated device page. Every allocated page has exactly one
// holder; a page with no holder is free (or waits, freed, for the copies that
// still touch it: HiCacheEngine's free-when-idle set).
struct PageHolder {
  enum class Kind : uint8_t {
    kRequest,  // A running request of one client (id: its holder id).
    kTree,     // The radix tree (id: 0).
    kLoad,     // A load-back in flight, not yet attached (id: the op id).
  };
  Kind kind = Kind::kRequest;
  uint64_t id = 0;

  static PageHolder Request(uint64_t holder) { return {Kind::kRequest, holder}; }
  static PageHolder Tree() { return {Kind::kTree, 0}; }
  static PageHolder Load(uint64_t op) { return {Kind::kLoad, op}; }
  friend bool operator==(const PageHolder& a, const PageHolder& b) {
    return a.kind == b.kind && a.id == b.id;
  }
};

// The engine's single record of device-page ownership. Each request checks it
// before it changes anything: a client may free, insert or back up only pages
// that its own holder id holds (or, for insert, the tree's pages at their
// matched positions).
//
// Not thread-safe: owned by HiCacheEngine under its mutex.
class PageLedger {
 public:
  // Records newly allocated pages. REQUIRES: none of them is held.
  void Add(absl::Span<const LogicalPage> pages, PageHolder holder);
  // Hands held pages to `to`. REQUIRES: every page is held.
  void Move(absl::Span<const LogicalPage> pages, PageHolder to);
  // Forgets pages that are being freed. REQUIRES: every page is held.
  void Remove(absl::Span<const LogicalPage> pages);

  std::optional<PageHolder> HolderOf(LogicalPage page) const;
  bool IsHeldBy(LogicalPage page, PageHolder holder) const;
  // The pages of one request holder, in no particular order.
  std::vector<LogicalPage> PagesOfRequest(uint64_t holder) const;
  int64_t CountOfRequest(uint64_t holder) const;
  int64_t Count(PageHolder::Kind kind) const;
  int64_t size() const { return static_cast<int64_t>(holders_.size()); }

  // INVALID_ARGUMENT naming `field` and the first id that appears twice.
  static absl::Status CheckDistinct(absl::Span<const LogicalPage> pages,
                                    absl::string_view field);

  // Every page of the per-request index is in the map with that holder and
  // the kind counts add up. For tests and the engine's invariant checker.
  absl::Status CheckInvariants() const;

 private:
  absl::flat_hash_map<LogicalPage, PageHolder> holders_;
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<LogicalPage>> requests_;
  int64_t counts_[3] = {0, 0, 0};
};

}  // namespace hicache
