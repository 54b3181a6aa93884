#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/storage/store_key.h"

namespace hicache {

// What a file store's slots hold, and its durable log (docs/storage-tier.md
// §3): key -> (slot, checksum) for `capacity` fixed-size slots, the free
// slots, and a least-recently-used order for eviction.
//
// Durability. Every change is a fixed-size record appended to a log file
// (Flush writes what is buffered), and Open replays the log, so the index
// survives a SIGKILL once flushed. Order rules the owner keeps:
//  * Commit a key only after its bytes are in the slot (the bytes' write
//    completed). A crash before the Commit loses the page, never maps a key
//    to bytes that were not written.
//  * Flush after Reserve and before overwriting the slot it returned: the
//    erase of the evicted key is then on file before its bytes are gone.
// A record that was torn by a crash ends the replay (the tail is dropped);
// a record with a bad checksum or an impossible slot is skipped. Whatever a
// stale record maps, the page's checksum makes it a miss, not wrong bytes.
// The log is rewritten with only the live entries at Open and whenever it
// grows past twice them (plus 4,096 records).
//
// Slots are free, reserved (a write in flight), live (a key maps to them) or
// draining (erased while a read still pins them; free at the last Unpin).
//
// Not thread-safe: the owner serializes every call.
class StoreIndex {
 public:
  struct Options {
    std::string path;      // The log file.
    int64_t capacity = 0;  // Slots; >= 1.
    // What the slots mean (page size, layout); a log written with another
    // format is discarded at Open (a cold start), as is one of another
    // capacity.
    uint64_t format = 0;
  };
  struct OpenReport {
    int64_t entries = 0;          // Live entries after the replay.
    int64_t records = 0;          // Records replayed.
    int64_t records_skipped = 0;  // Bad checksum or impossible slot.
    bool torn_tail = false;       // The log ended in a partial record.
    std::string discarded;        // Non-empty: why the old log was dropped.
  };
  struct Entry {
    int64_t slot = 0;
    uint64_t checksum = 0;
  };

  // INVALID_ARGUMENT for a bad capacity; the OS error (UNAVAILABLE) when the
  // log cannot be read or written.
  static absl::StatusOr<std::unique_ptr<StoreIndex>> Open(
      const Options& options, OpenReport* report);
  ~StoreIndex();
  StoreIndex(const StoreIndex&) = delete;
  StoreIndex& operator=(const StoreIndex&) = delete;

  int64_t capacity() const { return capacity_; }
  int64_t size() const { return static_cast<int64_t>(map_.size()); }

  // The key's entry, or nullopt. Touch makes it the most recently used.
  std::optional<Entry> Find(const StoreKey& key) const;
  void Touch(const StoreKey& key);

  // A slot for a new page: a free one, or the least recently used live,
  // unpinned one, whose key is erased (*evicted). RESOURCE_EXHAUSTED when
  // every slot is reserved, draining or pinned.
  absl::StatusOr<int64_t> Reserve(std::optional<StoreKey>* evicted);
  // Maps key -> slot (a reserved one) with the page's checksum, as the most
  // recently used. A key already mapped elsewhere is remapped (its old slot
  // freed). INVALID_ARGUMENT for a slot that is not reserved.
  absl::Status Commit(const StoreKey& key, int64_t slot, uint64_t checksum);
  // Frees a reserved slot that will not be committed.
  void Release(int64_t slot);
  // Erases the key if present (true). Its slot is free, or draining while
  // pinned.
  bool Erase(const StoreKey& key);

  // Keeps a live slot's bytes from being reused (a read in flight). Pin
  // REQUIRES a live slot; Unpin a pinned one.
  void Pin(int64_t slot);
  void Unpin(int64_t slot);

  // Writes the buffered records to the log (and compacts it if due).
  absl::Status Flush();

  // The free list, the map, the LRU list and the pins agree.
  absl::Status CheckInvariants() const;

 private:
  enum class SlotState : uint8_t { kFree, kReserved, kLive, kDraining };
  struct Slot {
    SlotState state = SlotState::kFree;
    int32_t pins = 0;
    StoreKey key;
    uint64_t checksum = 0;
    int64_t prev = -1;  // LRU list (live slots): toward older.
    int64_t next = -1;  // Toward newer.
  };

  StoreIndex(const Options& options, int fd);
  void Replay(const std::string& bytes, OpenReport* report);
  void ApplyPut(const StoreKey& key, int64_t slot, uint64_t checksum);
  // Maps key -> slot as the most recently used (the slot's old state and
  // the key's old mapping are the caller's to have cleared).
  void MakeLive(const StoreKey& key, int64_t slot, uint64_t checksum);
  void FreeSlot(int64_t slot);
  void LinkNewest(int64_t slot);
  void Unlink(int64_t slot);
  void AppendRecord(uint8_t type, const StoreKey& key, int64_t slot,
                    uint64_t checksum);
  absl::Status Rewrite();

  const std::string path_;
  const int64_t capacity_;
  const uint64_t format_;
  int fd_;
  std::vector<Slot> slots_;
  std::vector<int64_t> free_;
  absl::flat_hash_map<StoreKey, int64_t> map_;
  int64_t oldest_ = -1;
  int64_t newest_ = -1;
  std::string buffer_;       // Records not yet written.
  int64_t log_records_ = 0;  // Records in the log file, written or buffered.
};

}  // namespace hicache
