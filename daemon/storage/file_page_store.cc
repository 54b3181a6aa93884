#include "daemon/storage/file_page_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "daemon/core/le_bytes.h"
#include "daemon/storage/thread_block_io.h"
#include "daemon/storage/uring_block_io.h"
#include "spdlog/spdlog.h"

namespace hicache {
namespace {

absl::Status OsError(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

uint64_t Checksum(const uint8_t* bytes, int64_t n) {
  return XXH3_64bits(bytes, static_cast<size_t>(n));
}

}  // namespace

// One slot's worth of aligned memory for O_DIRECT, taken from the store's
// spare buffers and given back when dropped (a fresh allocation of a large
// page costs an mmap, page faults and an munmap per I/O).
struct FilePageStore::Buffer {
  explicit Buffer(FilePageStore* store)
      : store(store), data(store->TakeBuffer()) {}
  ~Buffer() {
    if (data != nullptr) store->GiveBuffer(data);
  }
  Buffer(Buffer&& other) noexcept
      : store(other.store), data(std::exchange(other.data, nullptr)) {}
  Buffer(const Buffer&) = delete;
  FilePageStore* store;
  uint8_t* data;
};

uint8_t* FilePageStore::TakeBuffer() {
  {
    MutexLock lock(&buffers_mu_);
    if (!spare_.empty()) {
      uint8_t* b = spare_.back();
      spare_.pop_back();
      return b;
    }
  }
  return static_cast<uint8_t*>(
      std::aligned_alloc(kBlockIoAlignment, static_cast<size_t>(slot_bytes_)));
}

void FilePageStore::GiveBuffer(uint8_t* buffer) {
  {
    MutexLock lock(&buffers_mu_);
    // Enough for the I/Os in flight, twice over; the rest go back.
    if (spare_.size() < 2 * static_cast<size_t>(options_.queue_depth)) {
      spare_.push_back(buffer);
      return;
    }
  }
  std::free(buffer);
}

absl::StatusOr<std::unique_ptr<FilePageStore>> FilePageStore::Open(
    FilePageStoreOptions options) {
  if (options.directory.empty()) {
    return absl::InvalidArgumentError("the storage directory is empty");
  }
  if (options.page_bytes < 1 || options.capacity_pages < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a file store needs pages of at least 1 byte and room for at least 1 "
        "page (got ",
        options.page_bytes, " bytes, ", options.capacity_pages, " pages)"));
  }
  if (options.queue_depth < 1 || options.queue_depth > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "storage queue depth ", options.queue_depth, " is outside [1, 4096]"));
  }
  const int64_t slot_bytes = (options.page_bytes + kBlockIoAlignment - 1) /
                             kBlockIoAlignment * kBlockIoAlignment;
  if (options.capacity_pages > (int64_t{1} << 62) / slot_bytes) {
    return absl::InvalidArgumentError("the storage capacity overflows");
  }
  const int64_t file_bytes = options.capacity_pages * slot_bytes;
  std::error_code ec;
  std::filesystem::create_directories(options.directory, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "creating storage directory ", options.directory, ": ", ec.message()));
  }
  const std::string data_path =
      absl::StrCat(options.directory, "/", options.name, ".data");
  bool direct = options.direct_io;
  int fd = -1;
  if (direct) {
    fd = ::open(data_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT,
                0600);
    if (fd < 0 && errno == EINVAL) direct = false;  // tmpfs and the like.
  }
  if (!direct)
    fd = ::open(data_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return OsError("opening", data_path);
  auto fail = [fd](absl::Status s) {
    ::close(fd);
    return s;
  };
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "storage file ", data_path, " is in use by another process")));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) return fail(OsError("stat of", data_path));
  if (st.st_size < file_bytes) {
    struct statvfs vfs;
    if (::fstatvfs(fd, &vfs) != 0)
      return fail(OsError("statvfs of", data_path));
    const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    const uint64_t missing = static_cast<uint64_t>(file_bytes - st.st_size);
    if (avail < missing) {
      return fail(absl::ResourceExhaustedError(absl::StrCat(
          "the storage tier needs ", missing, " more bytes in ",
          options.directory, " (", options.capacity_pages, " pages of ",
          slot_bytes, " bytes) but the file system has ", avail,
          " free: lower --l3_pages or free space")));
    }
    const int rc = ::posix_fallocate(fd, 0, file_bytes);
    if (rc != 0 && (rc != EOPNOTSUPP || ::ftruncate(fd, file_bytes) != 0)) {
      errno = rc;
      return fail(OsError("allocating", data_path));
    }
  } else if (st.st_size > file_bytes && ::ftruncate(fd, file_bytes) != 0) {
    return fail(OsError("shrinking", data_path));
  }

  std::string format_bytes;
  LeWriter w(&format_bytes);
  w.U64(options.format);
  w.I64(options.page_bytes);
  w.I64(slot_bytes);
  StoreIndex::Options index_options;
  index_options.path =
      absl::StrCat(options.directory, "/", options.name, ".index");
  index_options.capacity = options.capacity_pages;
  index_options.format = XXH3_64bits(format_bytes.data(), format_bytes.size());
  StoreIndex::OpenReport report;
  absl::StatusOr<std::unique_ptr<StoreIndex>> index =
      StoreIndex::Open(index_options, &report);
  if (!index.ok()) return fail(index.status());

  std::unique_ptr<BlockIo> io;
  if (options.io != FilePageStoreOptions::Io::kThreads) {
    absl::StatusOr<std::unique_ptr<UringBlockIo>> uring =
        UringBlockIo::Create(fd, options.queue_depth);
    if (uring.ok()) {
      io = *std::move(uring);
    } else if (options.io == FilePageStoreOptions::Io::kUring) {
      return fail(uring.status());
    } else {
      spdlog::warn("storage {}: io_uring is unavailable ({}); using threads",
                   options.directory, uring.status().ToString());
    }
  }
  if (io == nullptr) {
    io = std::make_unique<ThreadBlockIo>(fd, std::min(options.queue_depth, 16));
  }
  if (options.wrap_io) io = options.wrap_io(std::move(io));

  std::unique_ptr<FilePageStore> store(
      new FilePageStore(std::move(options), fd, direct, slot_bytes));
  store->report_ = report;
  {
    MutexLock lock(&store->mu_);
    store->index_ = *std::move(index);
  }
  store->io_ = std::move(io);
  return store;
}

FilePageStore::FilePageStore(FilePageStoreOptions options, int fd, bool direct,
                             int64_t slot_bytes)
    : options_(std::move(options)),
      fd_(fd),
      direct_(direct),
      slot_bytes_(slot_bytes) {}

FilePageStore::~FilePageStore() {
  io_.reset();  // Drains: every completion has run, every buffer is back.
  {
    MutexLock lock(&buffers_mu_);
    for (uint8_t* b : spare_) std::free(b);
    spare_.clear();
  }
  {
    MutexLock lock(&mu_);
    index_.reset();  // Flushes the log.
  }
  ::close(fd_);
}

std::string FilePageStore::Describe() const {
  return absl::StrCat("file ", options_.directory, "/", options_.name,
                      ".data, ", options_.capacity_pages, " pages, ",
                      io_->Describe(), direct_ ? ", O_DIRECT" : ", buffered");
}

void FilePageStore::Put(std::vector<StorePut> puts, StoreDone done) {
  std::vector<absl::Status> results(puts.size());
  std::vector<bool> wanted(puts.size(), false);
  for (size_t i = 0; i < puts.size(); ++i) {
    results[i] = CheckPageBytes(puts[i].bytes.size(), options_.page_bytes);
    wanted[i] = results[i].ok();
  }
  std::vector<StoreKey> keys;
  std::vector<int64_t> slots;
  std::vector<size_t> items;  // keys[j] is puts[items[j]].
  {
    MutexLock lock(&mu_);
    absl::flat_hash_set<StoreKey> in_batch;
    for (size_t i = 0; i < puts.size(); ++i) {
      if (!wanted[i]) continue;
      const StoreKey& key = puts[i].key;
      if (index_->Find(key).has_value() || !in_batch.insert(key).second) {
        index_->Touch(key);
        ++stats_.put_duplicates;
        continue;
      }
      std::optional<StoreKey> evicted;
      absl::StatusOr<int64_t> slot = index_->Reserve(&evicted);
      if (evicted.has_value()) ++stats_.evictions;
      if (!slot.ok()) {
        results[i] = slot.status();
        ++stats_.put_errors;
        continue;
      }
      keys.push_back(key);
      slots.push_back(*slot);
      items.push_back(i);
    }
    // The evicted keys' erases go on file before their slots are rewritten.
    if (absl::Status s = index_->Flush(); !s.ok()) {
      for (size_t j = 0; j < items.size(); ++j) {
        index_->Release(slots[j]);
        results[items[j]] = s;
        ++stats_.put_errors;
      }
      keys.clear();
      slots.clear();
      items.clear();
    }
  }
  if (items.empty()) {
    std::move(done)(std::move(results));
    return;
  }
  auto buffers = std::make_shared<std::vector<Buffer>>();
  buffers->reserve(items.size());
  std::vector<uint64_t> checksums;
  std::vector<BlockIoOp> ops;
  for (size_t j = 0; j < items.size(); ++j) {
    const absl::Span<const uint8_t> bytes = puts[items[j]].bytes;
    Buffer& b = buffers->emplace_back(this);
    std::memcpy(b.data, bytes.data(), bytes.size());
    std::memset(b.data + bytes.size(), 0, slot_bytes_ - bytes.size());
    checksums.push_back(Checksum(b.data, options_.page_bytes));
    ops.push_back(BlockIoOp{BlockIoOp::Kind::kWrite, slots[j] * slot_bytes_,
                            b.data, static_cast<size_t>(slot_bytes_)});
  }
  io_->Submit(std::move(ops),
              [this, buffers, keys = std::move(keys), slots = std::move(slots),
               checksums = std::move(checksums), items = std::move(items),
               results = std::move(results),
               done = std::move(done)](std::vector<absl::Status> io) mutable {
                FinishPut(keys, slots, checksums, io);
                for (size_t j = 0; j < items.size(); ++j) {
                  results[items[j]] = std::move(io[j]);
                }
                std::move(done)(std::move(results));
              });
}

void FilePageStore::FinishPut(const std::vector<StoreKey>& keys,
                              const std::vector<int64_t>& slots,
                              const std::vector<uint64_t>& checksums,
                              const std::vector<absl::Status>& io) {
  MutexLock lock(&mu_);
  for (size_t j = 0; j < keys.size(); ++j) {
    if (io[j].ok()) {
      if (absl::Status s = index_->Commit(keys[j], slots[j], checksums[j]);
          !s.ok()) {
        spdlog::error("storage {}: {}", options_.directory, s.ToString());
      }
      ++stats_.puts;
      stats_.put_bytes += options_.page_bytes;
    } else {
      index_->Release(slots[j]);
      ++stats_.put_errors;
    }
  }
  if (absl::Status s = index_->Flush(); !s.ok()) {
    // The pages are in place and served; a restart may lose them.
    spdlog::warn("storage {}: index not written: {}", options_.directory,
                 s.ToString());
  }
}

void FilePageStore::Get(std::vector<StoreGet> gets, StoreDone done) {
  std::vector<absl::Status> results(gets.size());
  std::vector<size_t> items;
  std::vector<StoreIndex::Entry> entries;
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < gets.size(); ++i) {
      ++stats_.gets;
      results[i] = CheckPageBytes(gets[i].bytes.size(), options_.page_bytes);
      if (!results[i].ok()) continue;
      std::optional<StoreIndex::Entry> entry = index_->Find(gets[i].key);
      if (!entry.has_value()) {
        results[i] = absl::NotFoundError("not in the storage tier");
        ++stats_.get_misses;
        continue;
      }
      index_->Pin(entry->slot);
      index_->Touch(gets[i].key);
      items.push_back(i);
      entries.push_back(*entry);
    }
  }
  if (items.empty()) {
    std::move(done)(std::move(results));
    return;
  }
  auto buffers = std::make_shared<std::vector<Buffer>>();
  buffers->reserve(items.size());
  std::vector<BlockIoOp> ops;
  for (size_t j = 0; j < items.size(); ++j) {
    Buffer& b = buffers->emplace_back(this);
    ops.push_back(BlockIoOp{BlockIoOp::Kind::kRead,
                            entries[j].slot * slot_bytes_, b.data,
                            static_cast<size_t>(slot_bytes_)});
  }
  io_->Submit(
      std::move(ops),
      [this, buffers, gets = std::move(gets), items = std::move(items),
       entries = std::move(entries), results = std::move(results),
       done = std::move(done)](std::vector<absl::Status> io) mutable {
        // Verify and copy out without the lock; then settle the index.
        for (size_t j = 0; j < items.size(); ++j) {
          absl::Status& r = results[items[j]];
          r = std::move(io[j]);
          if (!r.ok()) continue;
          const uint8_t* data = (*buffers)[j].data;
          if (Checksum(data, options_.page_bytes) != entries[j].checksum) {
            r = absl::DataLossError(
                "the stored page failed its checksum (a torn write or "
                "corruption); treated as a miss");
            continue;
          }
          std::memcpy(gets[items[j]].bytes.data(), data,
                      static_cast<size_t>(options_.page_bytes));
        }
        {
          MutexLock lock(&mu_);
          bool erased = false;
          for (size_t j = 0; j < items.size(); ++j) {
            const absl::Status& r = results[items[j]];
            index_->Unpin(entries[j].slot);
            if (r.ok()) {
              ++stats_.get_hits;
              stats_.get_bytes += options_.page_bytes;
            } else if (absl::IsDataLoss(r)) {
              ++stats_.checksum_failures;
              // Erase only what this read found: the key may have been
              // stored again meanwhile.
              std::optional<StoreIndex::Entry> now =
                  index_->Find(gets[items[j]].key);
              if (now.has_value() && now->slot == entries[j].slot &&
                  now->checksum == entries[j].checksum) {
                erased |= index_->Erase(gets[items[j]].key);
              }
            } else {
              ++stats_.get_errors;
            }
          }
          if (erased) {
            if (absl::Status s = index_->Flush(); !s.ok()) {
              spdlog::warn("storage {}: index not written: {}",
                           options_.directory, s.ToString());
            }
          }
        }
        std::move(done)(std::move(results));
      });
}

void FilePageStore::Exists(std::vector<StoreKey> keys, StoreExistsDone done) {
  std::vector<bool> found(keys.size());
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      found[i] = index_->Find(keys[i]).has_value();
    }
  }
  std::move(done)(std::move(found));
}

void FilePageStore::Remove(std::vector<StoreKey> keys, StoreDone done) {
  std::vector<absl::Status> results(keys.size());
  {
    MutexLock lock(&mu_);
    for (const StoreKey& key : keys) {
      if (index_->Erase(key)) ++stats_.removes;
    }
    if (absl::Status s = index_->Flush(); !s.ok()) {
      for (absl::Status& r : results) r = s;
    }
  }
  std::move(done)(std::move(results));
}

PageStoreStats FilePageStore::Stats() const {
  MutexLock lock(&mu_);
  PageStoreStats s = stats_;
  s.capacity_pages = index_->capacity();
  s.used_pages = index_->size();
  return s;
}

absl::Status FilePageStore::CheckInvariants() const {
  MutexLock lock(&mu_);
  return index_->CheckInvariants();
}

}  // namespace hicache
