#pragma once

// PageStore: the storage tier's (L3's) interface, below the engine
// (docs/storage-tier.md). A store keeps whole pages of one fixed size under
// StoreKeys; the engine decides what to put and what to ask for, and never
// names a concrete store (main injects one: FilePageStore on a local NVMe,
// RedisPageStore shared between nodes).
//
// A store is a cache, not a database: it may drop any page at any time to
// make room (and says so in Stats), and a page it cannot return intact is a
// miss, never wrong bytes.
//
// Every operation is batched and asynchronous. `done` runs exactly once per
// call, with one result per item in the order given. It may run before the
// call returns, on the calling thread, or later on a thread of the store;
// never with a lock of the store held, so it may call the store again. It
// must not block for long: it holds up the store's completions.
//
// Per-item results:
//   Put:    OK (stored, or already there: a key names its bytes);
//           RESOURCE_EXHAUSTED (no room that could be taken); UNAVAILABLE or
//           INTERNAL (I/O error; nothing is stored under the key).
//   Get:    OK (the bytes were copied out, checksum verified); NOT_FOUND;
//           DATA_LOSS (the stored bytes failed their checksum: the entry is
//           removed, the output bytes are unspecified); UNAVAILABLE or
//           INTERNAL (I/O error).
//   Remove: OK whether or not the key was there.
// Exists answers true for keys a Get issued now would find (it may still
// miss, if the page is dropped or found corrupt meanwhile).
//
// INVALID_ARGUMENT for an item whose span is not exactly page_bytes().
// The spans of Put and Get must stay valid until `done` runs. Thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "daemon/storage/store_key.h"

namespace hicache {

struct StorePut {
  StoreKey key;
  absl::Span<const uint8_t> bytes;
};

struct StoreGet {
  StoreKey key;
  absl::Span<uint8_t> bytes;
};

using StoreDone = absl::AnyInvocable<void(std::vector<absl::Status>) &&>;
using StoreExistsDone = absl::AnyInvocable<void(std::vector<bool>) &&>;

struct PageStoreStats {
  int64_t capacity_pages = 0;  // -1: unknown (a shared store sizes itself).
  int64_t used_pages = 0;      // -1: unknown.
  int64_t puts = 0;            // Items stored (new keys).
  int64_t put_duplicates = 0;  // Items whose key was already there.
  int64_t put_errors = 0;
  int64_t put_bytes = 0;
  int64_t gets = 0;
  int64_t get_hits = 0;
  int64_t get_misses = 0;         // NOT_FOUND.
  int64_t checksum_failures = 0;  // DATA_LOSS.
  int64_t get_errors = 0;         // I/O errors.
  int64_t get_bytes = 0;
  int64_t evictions = 0;  // Pages the store dropped to make room.
  int64_t removes = 0;    // Keys removed on request.
};

class PageStore {
 public:
  virtual ~PageStore() = default;

  // A line for logs and `hicachectl`: the kind, where, and how it does I/O.
  virtual std::string Describe() const = 0;
  virtual int64_t page_bytes() const = 0;

  virtual void Put(std::vector<StorePut> puts, StoreDone done) = 0;
  virtual void Get(std::vector<StoreGet> gets, StoreDone done) = 0;
  virtual void Exists(std::vector<StoreKey> keys, StoreExistsDone done) = 0;
  virtual void Remove(std::vector<StoreKey> keys, StoreDone done) = 0;

  virtual PageStoreStats Stats() const = 0;
};

// The per-item INVALID_ARGUMENT of a Put or Get whose span is not exactly
// `page_bytes` (OK when it is), for stores to share.
absl::Status CheckPageBytes(size_t bytes, int64_t page_bytes);

// Blocking forms, for tools, tests and start-up: wait for `done`.
std::vector<absl::Status> PutAndWait(PageStore& store,
                                     std::vector<StorePut> puts);
std::vector<absl::Status> GetAndWait(PageStore& store,
                                     std::vector<StoreGet> gets);
std::vector<bool> ExistsAndWait(PageStore& store, std::vector<StoreKey> keys);
std::vector<absl::Status> RemoveAndWait(PageStore& store,
                                        std::vector<StoreKey> keys);

}  // namespace hicache
