#include "daemon/storage/store_index.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "daemon/core/le_bytes.h"
#include "spdlog/spdlog.h"

namespace hicache {
namespace {

// Log header: magic (8) | version u32 | 0 u32 | format u64 | capacity i64 |
// XXH3-64 of the 32 bytes before it.
// Record: type u8 | 7 zero bytes | key hi u64 | key lo u64 | slot i64 |
// checksum u64 | XXH3-64 of the 40 bytes before it.
constexpr char kMagic[8] = {'H', 'C', 'L', '3', 'I', 'N', 'D', 'X'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderSize = 40;
constexpr size_t kRecordSize = 48;
constexpr uint8_t kPut = 1;
constexpr uint8_t kErase = 2;
constexpr int64_t kCompactSlack = 4096;

absl::Status OsError(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

uint64_t Hash(absl::string_view bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::string EncodeHeader(uint64_t format, int64_t capacity) {
  std::string out(kMagic, sizeof(kMagic));
  LeWriter w(&out);
  w.U32(kVersion);
  w.U32(0);
  w.U64(format);
  w.I64(capacity);
  w.U64(Hash(out));
  return out;
}

absl::Status WriteAll(int fd, absl::string_view bytes,
                      const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return OsError("writing", path);
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::string();
    return OsError("opening", path);
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = OsError("reading", path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StoreIndex>> StoreIndex::Open(
    const Options& options, OpenReport* report) {
  if (options.capacity < 1) {
    return absl::InvalidArgumentError(absl::StrCat("storage index capacity ",
                                                   options.capacity,
                                                   " must be at least 1 page"));
  }
  *report = OpenReport{};
  absl::StatusOr<std::string> old = ReadAll(options.path);
  if (!old.ok()) return old.status();
  const int fd = ::open(options.path.c_str(),
                        O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return OsError("opening", options.path);
  std::unique_ptr<StoreIndex> index(new StoreIndex(options, fd));
  if (!old->empty()) {
    const std::string expected = EncodeHeader(options.format, options.capacity);
    if (old->size() < kHeaderSize ||
        absl::string_view(*old).substr(0, 8) != absl::string_view(kMagic, 8)) {
      report->discarded = "not a storage index";
    } else if (absl::string_view(*old).substr(0, kHeaderSize) != expected) {
      report->discarded =
          "written for another page format, capacity or version";
    } else {
      index->Replay(*old, report);
    }
  }
  // Start from a log of the live entries only.
  if (absl::Status s = index->Rewrite(); !s.ok()) return s;
  report->entries = index->size();
  return index;
}

StoreIndex::StoreIndex(const Options& options, int fd)
    : path_(options.path),
      capacity_(options.capacity),
      format_(options.format),
      fd_(fd),
      slots_(static_cast<size_t>(options.capacity)) {
  free_.reserve(slots_.size());
  for (int64_t s = capacity_ - 1; s >= 0; --s) free_.push_back(s);
}

StoreIndex::~StoreIndex() {
  // A lost tail loses pages, never maps a key to wrong bytes.
  if (absl::Status s = Flush(); !s.ok()) {
    spdlog::warn("storage index {}: the last records were not written: {}",
                 path_, s.ToString());
  }
  ::close(fd_);
}

void StoreIndex::Replay(const std::string& bytes, OpenReport* report) {
  LeReader r(absl::string_view(bytes).substr(kHeaderSize));
  while (r.remaining() > 0) {
    absl::string_view record;
    if (!r.Bytes(kRecordSize, &record)) {
      report->torn_tail = true;
      break;
    }
    ++report->records;
    LeReader f(record);
    uint8_t type = 0;
    StoreKey key;
    int64_t slot = 0;
    uint64_t checksum = 0;
    uint64_t hash = 0;
    f.U8(&type);
    f.Skip(7);
    f.U64(&key.hi);
    f.U64(&key.lo);
    f.I64(&slot);
    f.U64(&checksum);
    f.U64(&hash);
    if (hash != Hash(record.substr(0, kRecordSize - 8))) {
      ++report->records_skipped;
      continue;
    }
    if (type == kErase) {
      Erase(key);
    } else if (type == kPut && slot >= 0 && slot < capacity_) {
      ApplyPut(key, slot, checksum);
    } else {
      ++report->records_skipped;
    }
  }
  buffer_.clear();  // Replayed erases re-log nothing: Rewrite starts over.
  // The replay's frees pushed slots without taking any off: rebuild.
  free_.clear();
  for (int64_t s = capacity_ - 1; s >= 0; --s) {
    if (slots_[s].state == SlotState::kFree) free_.push_back(s);
  }
}

void StoreIndex::ApplyPut(const StoreKey& key, int64_t slot,
                          uint64_t checksum) {
  Slot& s = slots_[slot];
  if (s.state == SlotState::kLive) {
    map_.erase(s.key);
    Unlink(slot);
    FreeSlot(slot);
  }
  if (auto it = map_.find(key); it != map_.end()) {
    const int64_t old = it->second;
    map_.erase(it);
    Unlink(old);
    FreeSlot(old);
  }
  MakeLive(key, slot, checksum);
}

void StoreIndex::MakeLive(const StoreKey& key, int64_t slot,
                          uint64_t checksum) {
  Slot& s = slots_[slot];
  s.state = SlotState::kLive;
  s.key = key;
  s.checksum = checksum;
  map_[key] = slot;
  LinkNewest(slot);
}

std::optional<StoreIndex::Entry> StoreIndex::Find(const StoreKey& key) const {
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  return Entry{it->second, slots_[it->second].checksum};
}

void StoreIndex::Touch(const StoreKey& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return;
  Unlink(it->second);
  LinkNewest(it->second);
}

absl::StatusOr<int64_t> StoreIndex::Reserve(std::optional<StoreKey>* evicted) {
  evicted->reset();
  if (free_.empty()) {
    int64_t victim = oldest_;
    while (victim >= 0 && slots_[victim].pins > 0) victim = slots_[victim].next;
    if (victim < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("every one of the ", capacity_,
                       " storage slots is being written or read"));
    }
    *evicted = slots_[victim].key;
    Erase(slots_[victim].key);
  }
  const int64_t slot = free_.back();
  free_.pop_back();
  slots_[slot].state = SlotState::kReserved;
  return slot;
}

absl::Status StoreIndex::Commit(const StoreKey& key, int64_t slot,
                                uint64_t checksum) {
  if (slot < 0 || slot >= capacity_ ||
      slots_[slot].state != SlotState::kReserved) {
    return absl::InvalidArgumentError(
        absl::StrCat("storage slot ", slot, " is not reserved"));
  }
  if (auto it = map_.find(key); it != map_.end()) Erase(key);
  MakeLive(key, slot, checksum);
  AppendRecord(kPut, key, slot, checksum);
  return absl::OkStatus();
}

void StoreIndex::Release(int64_t slot) {
  if (slot < 0 || slot >= capacity_ ||
      slots_[slot].state != SlotState::kReserved) {
    return;
  }
  FreeSlot(slot);
}

bool StoreIndex::Erase(const StoreKey& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  const int64_t slot = it->second;
  map_.erase(it);
  Unlink(slot);
  AppendRecord(kErase, key, slot, 0);
  if (slots_[slot].pins > 0) {
    slots_[slot].state = SlotState::kDraining;
  } else {
    FreeSlot(slot);
  }
  return true;
}

void StoreIndex::Pin(int64_t slot) { ++slots_[slot].pins; }

void StoreIndex::Unpin(int64_t slot) {
  Slot& s = slots_[slot];
  if (--s.pins == 0 && s.state == SlotState::kDraining) FreeSlot(slot);
}

void StoreIndex::FreeSlot(int64_t slot) {
  slots_[slot] = Slot{};
  free_.push_back(slot);
}

void StoreIndex::LinkNewest(int64_t slot) {
  Slot& s = slots_[slot];
  s.prev = newest_;
  s.next = -1;
  if (newest_ >= 0) slots_[newest_].next = slot;
  newest_ = slot;
  if (oldest_ < 0) oldest_ = slot;
}

void StoreIndex::Unlink(int64_t slot) {
  Slot& s = slots_[slot];
  if (s.prev >= 0) slots_[s.prev].next = s.next;
  if (s.next >= 0) slots_[s.next].prev = s.prev;
  if (oldest_ == slot) oldest_ = s.next;
  if (newest_ == slot) newest_ = s.prev;
  s.prev = s.next = -1;
}

void StoreIndex::AppendRecord(uint8_t type, const StoreKey& key, int64_t slot,
                              uint64_t checksum) {
  const size_t start = buffer_.size();
  LeWriter w(&buffer_);
  w.U8(type);
  w.Zeros(7);
  w.U64(key.hi);
  w.U64(key.lo);
  w.I64(slot);
  w.U64(checksum);
  w.U64(Hash(absl::string_view(buffer_).substr(start)));
  ++log_records_;
}

absl::Status StoreIndex::Flush() {
  if (log_records_ > 2 * size() + kCompactSlack) return Rewrite();
  if (buffer_.empty()) return absl::OkStatus();
  absl::Status s = WriteAll(fd_, buffer_, path_);
  buffer_.clear();
  return s;
}

absl::Status StoreIndex::Rewrite() {
  buffer_.clear();
  log_records_ = 0;
  // Oldest first, so a replay rebuilds the same LRU order.
  for (int64_t s = oldest_; s >= 0; s = slots_[s].next) {
    AppendRecord(kPut, slots_[s].key, s, slots_[s].checksum);
  }
  const std::string tmp = path_ + ".tmp";
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return OsError("opening", tmp);
  absl::Status s = WriteAll(fd, EncodeHeader(format_, capacity_), tmp);
  if (s.ok()) s = WriteAll(fd, buffer_, tmp);
  if (s.ok() && ::fsync(fd) != 0) s = OsError("syncing", tmp);
  ::close(fd);
  buffer_.clear();
  if (!s.ok()) return s;
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    return OsError("renaming to", path_);
  }
  const int next = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (next < 0) return OsError("opening", path_);
  ::close(fd_);
  fd_ = next;
  return absl::OkStatus();
}

absl::Status StoreIndex::CheckInvariants() const {
  int64_t live = 0;
  std::vector<bool> on_free(slots_.size(), false);
  for (int64_t s : free_) {
    if (s < 0 || s >= capacity_ || on_free[s]) {
      return absl::InternalError(
          absl::StrCat("free list holds slot ", s, " twice or out of range"));
    }
    on_free[s] = true;
  }
  for (int64_t s = 0; s < capacity_; ++s) {
    const Slot& slot = slots_[s];
    if ((slot.state == SlotState::kFree) != on_free[s]) {
      return absl::InternalError(absl::StrCat(
          "slot ", s, " is free in state but not on the free list, or back"));
    }
    if (slot.state == SlotState::kLive) {
      ++live;
      auto it = map_.find(slot.key);
      if (it == map_.end() || it->second != s) {
        return absl::InternalError(
            absl::StrCat("live slot ", s, " is not mapped by its key"));
      }
    }
    if (slot.pins < 0 || (slot.pins > 0 && slot.state != SlotState::kLive &&
                          slot.state != SlotState::kDraining)) {
      return absl::InternalError(absl::StrCat("slot ", s, " has ", slot.pins,
                                              " pins in state ",
                                              static_cast<int>(slot.state)));
    }
    if (slot.state == SlotState::kDraining && slot.pins == 0) {
      return absl::InternalError(
          absl::StrCat("slot ", s, " drains with no pin"));
    }
  }
  if (live != size()) {
    return absl::InternalError(
        absl::StrCat(live, " live slots but ", size(), " keys mapped"));
  }
  int64_t listed = 0;
  for (int64_t s = oldest_, prev = -1; s >= 0; prev = s, s = slots_[s].next) {
    if (slots_[s].state != SlotState::kLive || slots_[s].prev != prev ||
        ++listed > live) {
      return absl::InternalError("the LRU list is broken");
    }
  }
  if (listed != live) {
    return absl::InternalError(absl::StrCat("the LRU list holds ", listed,
                                            " of ", live, " live slots"));
  }
  return absl::OkStatus();
}

}  // namespace hicache
