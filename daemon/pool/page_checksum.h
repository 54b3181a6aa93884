#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/core/daemon_config.h"
#include "daemon/pool/kv_geometry.h"

namespace hicache {

// Checksums of logical host (L2) pages, for a durable index of the host tier
// to record and for recovery to verify before a page is served again.
//
// The checksum of host page p is XXH3-64 (seed 0, libxxhash) of the page's
// bytes in a fixed order: family by family, and inside a family layer by
// layer, each (family, layer) block of BlockBytes(family) = P * row bytes.
// That is exactly the byte order of a page-first page, so:
//  * Under HostLayout::kPageFirst the page is one contiguous run and is hashed
//    in one call.
//  * Under HostLayout::kLayerFirst it is one run per (family, layer), hashed
//    with a streaming XXH3 state in the same order.
// The checksum is therefore the same for the same page bytes whatever the
// layout. It does NOT identify the layout, the geometry or the page index: a
// pool reinterpreted under another layout or geometry must be caught by the
// geometry check (KvGeometry::HostFingerprint in the segment name), not by
// checksums.
//
// A host pool view is (geometry, layout, num_pages, pool): `pool` must hold at
// least geometry.PoolBytes(num_pages) bytes laid out as KvGeometry describes.
// num_pages is the pool's page count (under layer_first it sets the size of
// every (family, layer) region), not the number of pages to hash; a wrong one
// reads the wrong bytes (still inside the view).
// Every function validates the view and every page before reading a byte:
// INVALID_ARGUMENT for num_pages < 0, a pool span shorter than
// PoolBytes(num_pages) (or a null pool with num_pages > 0), or a page outside
// [0, num_pages); nothing outside the span is ever read.
//
// The bytes are read without synchronisation: the caller ensures that no one
// writes the pages being hashed (at recovery, nothing else maps the pool yet;
// at commit, the page's copy has completed).

// Checksum of one page.
absl::StatusOr<uint64_t> HostPageChecksum(const KvGeometry& geometry,
                                          HostLayout layout, int64_t num_pages,
                                          absl::Span<const uint8_t> pool,
                                          int64_t page);

// Checksums of `pages`, in order (result[i] is the checksum of pages[i];
// repeats allowed). Single-threaded. All pages are validated first.
absl::StatusOr<std::vector<uint64_t>> HostPageChecksums(
    const KvGeometry& geometry, HostLayout layout, int64_t num_pages,
    absl::Span<const uint8_t> pool, absl::Span<const int64_t> pages);

// Verifies pages[i] against expected[i] on `threads` threads (each takes a
// contiguous share of the list; at most pages.size() threads are started, and
// none when threads == 1 or the list is short). Returns, in ascending order,
// the positions i whose checksum differs. Blocks until done: recovery calls it
// from its own background thread and keeps unverified nodes unmatchable
// meanwhile. INVALID_ARGUMENT (before any hashing) for a bad view or page,
// pages.size() != expected.size(), or threads < 1.
absl::StatusOr<std::vector<size_t>> VerifyHostPages(
    const KvGeometry& geometry, HostLayout layout, int64_t num_pages,
    absl::Span<const uint8_t> pool, absl::Span<const int64_t> pages,
    absl::Span<const uint64_t> expected, int threads);

// The bytes of host page `page` in the checksum's order (a page-first
// page: family by family, layer by layer), copied out into `out`, or in from
// `in`: the form a page takes outside the pool (the storage tier). `out` and
// `in` must be exactly geometry.BytesPerPage() bytes (INVALID_ARGUMENT
// otherwise, with the view and page checks above). HostPageChecksum of a
// page equals XXH3-64 of ReadHostPage's bytes.
absl::Status ReadHostPage(const KvGeometry& geometry, HostLayout layout,
                          int64_t num_pages, absl::Span<const uint8_t> pool,
                          int64_t page, absl::Span<uint8_t> out);
absl::Status WriteHostPage(const KvGeometry& geometry, HostLayout layout,
                           int64_t num_pages, absl::Span<uint8_t> pool,
                           int64_t page, absl::Span<const uint8_t> in);

}  // namespace hicache
