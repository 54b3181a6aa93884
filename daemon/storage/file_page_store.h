#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/core/mutex.h"
#include "daemon/storage/block_io.h"
#include "daemon/storage/page_store.h"
#include "daemon/storage/store_index.h"

namespace hicache {

// The local NVMe storage tier (docs/storage-tier.md §3): one preallocated
// data file of fixed-size slots and its StoreIndex log, in one directory,
// for one rank. Survives daemon restarts and upgrades: Open replays the
// index, and every page's XXH3-64 checksum (kept in the index) is verified
// on each read, so a torn or corrupted page is a miss (DATA_LOSS, counted,
// the entry erased), never wrong bytes. When full, a Put evicts the least
// recently used page that no read holds.
//
// I/O goes through a BlockIo: io_uring with O_DIRECT where the kernel and
// file system allow them, else threads and the page cache (Describe says
// which). Pages are written from and read into aligned bounce buffers, one
// slot (page_bytes rounded up to 4 KiB) each.
struct FilePageStoreOptions {
  std::string directory;       // Created if missing.
  std::string name = "pages";  // Files: <name>.data and <name>.index.
  int64_t page_bytes = 0;
  int64_t capacity_pages = 0;
  // What the pages mean (the engine's layout fingerprint). A store written
  // under another one is emptied at Open.
  uint64_t format = 0;
  enum class Io { kAuto, kUring, kThreads };
  Io io = Io::kAuto;
  int queue_depth = 64;   // io_uring's; the thread pool uses min(it, 16).
  bool direct_io = true;  // O_DIRECT when the file system takes it.
  // Wraps the BlockIo (fault injection in tests); nullptr: none.
  std::function<std::unique_ptr<BlockIo>(std::unique_ptr<BlockIo>)> wrap_io;
};

class FilePageStore final : public PageStore {
 public:
  // Checks the options, creates or reopens the files, and checks that the
  // file system has room for the whole data file (RESOURCE_EXHAUSTED naming
  // what is missing) before allocating it. INVALID_ARGUMENT for bad options;
  // UNAVAILABLE for OS errors.
  static absl::StatusOr<std::unique_ptr<FilePageStore>> Open(
      FilePageStoreOptions options);
  // Waits for every operation in flight.
  ~FilePageStore() override;

  std::string Describe() const override;
  int64_t page_bytes() const override { return options_.page_bytes; }

  void Put(std::vector<StorePut> puts, StoreDone done) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void Get(std::vector<StoreGet> gets, StoreDone done) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void Exists(std::vector<StoreKey> keys, StoreExistsDone done) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void Remove(std::vector<StoreKey> keys, StoreDone done) override
      ABSL_LOCKS_EXCLUDED(mu_);
  PageStoreStats Stats() const override ABSL_LOCKS_EXCLUDED(mu_);

  // What Open found in the index.
  const StoreIndex::OpenReport& open_report() const { return report_; }
  bool direct_io() const { return direct_; }
  absl::Status CheckInvariants() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Buffer;
  uint8_t* TakeBuffer() ABSL_LOCKS_EXCLUDED(buffers_mu_);
  void GiveBuffer(uint8_t* buffer) ABSL_LOCKS_EXCLUDED(buffers_mu_);

  FilePageStore(FilePageStoreOptions options, int fd, bool direct,
                int64_t slot_bytes);
  // Commits the written pages (io[j] OK) and releases the others' slots.
  void FinishPut(const std::vector<StoreKey>& keys,
                 const std::vector<int64_t>& slots,
                 const std::vector<uint64_t>& checksums,
                 const std::vector<absl::Status>& io) ABSL_LOCKS_EXCLUDED(mu_);

  const FilePageStoreOptions options_;
  const int fd_;
  const bool direct_;
  const int64_t slot_bytes_;
  StoreIndex::OpenReport report_;
  mutable Mutex mu_;
  std::unique_ptr<StoreIndex> index_ ABSL_GUARDED_BY(mu_);
  PageStoreStats stats_ ABSL_GUARDED_BY(mu_);
  Mutex buffers_mu_;  // Lock order: mu_ is never held while taking it.
  std::vector<uint8_t*> spare_ ABSL_GUARDED_BY(buffers_mu_);
  // Declared last: destroyed first, so it drains before the index goes.
  std::unique_ptr<BlockIo> io_;
};

}  // namespace hicache
