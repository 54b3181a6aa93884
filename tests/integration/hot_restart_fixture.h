#pragma once

// The fixture of hot_restart_test (issue 15): a real hicached with
// --state_dir on a socket in a temporary directory, a unique --instance
// whose /dev/shm segments are removed at the end (also after a failure),
// and this process as the scheduler. It maps every rank's device segment,
// writes a KV pattern that depends on the tokens into the pages Admit gave
// it, stores every layer of the backup over its BackupSession stream and
// completes the request; after a restart it loads host hits back into
// fresh device pages and checks every byte on every rank.
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/cpp/hicache_session.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "tests/testing/binaries.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace hicache::hot_restart {

constexpr uint32_t kPageSize = 4;

// Tokens base, base + 1, ...: `pages` pages of `page_size`.
std::vector<int32_t> Tokens(int32_t base, int pages,
                            uint32_t page_size = kPageSize);
// a followed by b.
std::vector<int32_t> Concat(std::vector<int32_t> a,
                            const std::vector<int32_t>& b);
// The KV byte of a page: a function of the page's first token (the tokens
// are distinct per prefix, so this stands for "the whole prefix"), the
// page's position, the (family, layer) block and the byte in it.
uint8_t Pattern(int32_t first_token, int64_t position, int family,
                uint32_t layer, uint64_t byte);
// Entries of /dev/shm whose name starts with `prefix`.
std::vector<std::string> ShmEntries(const std::string& prefix);
// The file's size, or -1 if it does not exist.
int64_t FileSize(const std::string& path);
// /dev/shm path of a shm_open name (with or without its leading '/').
std::string ShmPath(const std::string& name);
// `flags` with the flag `name` (e.g. "--page_size") set to `value`, or
// removed when `value` is empty.
std::vector<std::string> WithFlag(std::vector<std::string> flags,
                                  const std::string& name,
                                  const std::string& value);

class HotRestartTest : public ::testing::Test {
 protected:
  ~HotRestartTest() override;

  std::vector<std::string> Flags(uint32_t cp, uint32_t page_size = kPageSize);

  // Starts `binary` with `flags` and connects once it answers.
  void Start(const std::vector<std::string>& flags,
             const std::string& binary = testing::DaemonPath());

  void Connect();

  // Drops the client side without telling the daemon anything.
  void Disconnect();

  // Sends `signal` and expects the daemon to exit with `code`. Before a
  // SIGTERM the client closes its stream and session, as a scheduler would
  // on a planned restart (the daemon's drain need not wait for them).
  void Stop(int signal, int code);

  v1::CacheStats Stats();

  // The (family, layer) block of a logical device page in its owner's
  // segment (owner = page % cp), or null (and a failure) out of bounds.
  uint8_t* Block(int64_t page, int family, uint32_t layer);

  // Writes the pattern of `tokens` into `pages` from position `from`.
  void WriteKv(const std::vector<int32_t>& tokens,
               const std::vector<int64_t>& pages, size_t from);

  // Checks the pattern of `tokens` in `pages` (every page, on its owner).
  void VerifyKv(const std::vector<int32_t>& tokens,
                const std::vector<int64_t>& pages);

  // One request: Admit with a backup, write the new pages' KV, store
  // `steps` layers of the backup (all: it commits; fewer: it stays
  // pending), Complete. Returns the node. With every layer stored, waits
  // for the commit.
  uint64_t Request(const std::vector<int32_t>& tokens, int steps = -1);

  // Background traffic: Request without assertions and without waiting for
  // the commit (the daemon may die under it). False on any error or when
  // the request is not admitted for a fresh forward (e.g. it should load).
  bool TryRequest(const std::vector<int32_t>& tokens);

  // Waits until `puts` host copies were handed to the journal since the
  // start, the journal grew since the start or the last wait (call it only
  // after new records), and the file holds everything written (durable size
  // == file size, 3 reads 30 ms apart: the writer batches every 10 ms).
  void WaitJournal(int64_t puts);

  // Waits until `ready(stats)` holds, every host-tier change reported is
  // durable (journal_backlog_events and journal_not_durable_records 0: a
  // condition, not a time) and the journal file holds everything written
  // (durable size == file size), unchanged over 3 reads `period` apart,
  // within `timeout` (fails the test otherwise). The settled journal
  // size goes to *settled_bytes when given.
  void WaitJournalSettled(
      const std::function<bool(const v1::CacheStats&)>& ready,
      absl::Duration period, absl::Duration timeout,
      uint64_t* settled_bytes = nullptr);

  // InspectNode of `node` into *info (fails the test if the call fails).
  void Inspect(uint64_t node, v1::NodeInfo* info);

  // Host hit of `tokens` (peek: no hit counted, nothing locked). After a
  // restart the device tier is empty, so it is the whole hit.
  int64_t HostHit(const std::vector<int32_t>& tokens);

  // Device and host hit of `tokens` (peek), 0 if the match fails.
  int64_t CachedTokens(const std::vector<int32_t>& tokens);

  // Loads `tokens` back (all of it past what earlier loads put on the device
  // must come from the host tier) and checks every byte of the whole request
  // on every rank; releases the lock. With `complete` null the whole prefix
  // must load. Otherwise a load the daemon could not place (miss_reason
  // "no_device_memory": the device pool is held by locks and by backups
  // still in flight, which depends on how far the copy workers got) is
  // allowed: the part it returned is verified, and *complete says whether
  // all of it came.
  void LoadAndVerify(const std::vector<int32_t>& tokens,
                     bool* complete = nullptr);

  int64_t DevicePagesAllocated();

  // MatchPrefix of `tokens` with peek (no hit counted, nothing locked);
  // nullopt (and a failure) if the call fails.
  std::optional<v1::MatchResult> PeekMatch(const std::vector<int32_t>& tokens);

  std::vector<std::string> HostSegments();

  static inline std::atomic<int> counter_{0};
  const std::string instance_ =
      absl::StrCat("hrt", getpid(), "-", counter_.fetch_add(1));
  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("d.sock");
  const std::string state_dir_ = dir_.Child("state");
  std::unique_ptr<testing::Subprocess> daemon_;
  std::shared_ptr<v1::HiCache::Stub> stub_;
  std::unique_ptr<client::Session> session_;
  std::unique_ptr<client::BackupStream> backups_;
  v1::GetLayoutResponse layout_;
  std::vector<std::unique_ptr<client::MappedSegment>> device_;
  uint32_t cp_ = 0;
  uint32_t page_size_ = 0;
  int64_t committed_ = 0;       // backups_committed expected (Stats()).
  uint64_t journal_bytes_ = 0;  // Durable journal size at the last wait.
};

}  // namespace hicache::hot_restart
