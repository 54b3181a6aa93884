#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/core/mutex.h"
#include "daemon/storage/page_store.h"

namespace hicache {

// A storage tier shared between nodes (docs/storage-tier.md §4): pages in
// Redis or Valkey (a single server or a cluster) through hiredis, so that
// daemons on different nodes hit each other's prefixes (the keys are the
// same on every daemon of one layout).
//
// A page is the value of key `key_prefix` + StoreKey::ToHex(): its XXH3-64
// checksum (8 bytes, little-endian), its length (8 bytes) and its bytes. A
// value of another length or checksum is a miss (DATA_LOSS, counted, and
// deleted), never wrong bytes. Room is the server's business (run it with
// a maxmemory and an allkeys-lru policy); Stats reports capacity and use as
// unknown (-1).
//
// Cluster mode: a MOVED or ASK reply is followed (ASK with ASKING) on a
// connection to the node it names, and MOVED slots are remembered per
// worker. Every operation is one key, so no cross-slot request exists.
//
// `connections` worker threads each hold their own connection(s); a batch
// runs pipelined on one worker. A broken connection is reopened on the
// next batch; the batch it broke fails (UNAVAILABLE). Thread-safe.
struct RedisPageStoreOptions {
  // "unix:/path/to/socket", "host:port" or "redis://host:port".
  std::string address;
  std::string key_prefix = "hicache:";
  int64_t page_bytes = 0;
  int connections = 4;
  absl::Duration timeout = absl::Seconds(5);
};

class RedisPageStore final : public PageStore {
 public:
  // Connects once (PING) to fail at start rather than at the first page:
  // UNAVAILABLE naming the address when the server does not answer;
  // INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<RedisPageStore>> Open(
      RedisPageStoreOptions options);
  // Runs what is queued, then closes the connections.
  ~RedisPageStore() override ABSL_LOCKS_EXCLUDED(mu_);

  std::string Describe() const override;
  int64_t page_bytes() const override { return options_.page_bytes; }
  void Put(std::vector<StorePut> puts, StoreDone done) override;
  void Get(std::vector<StoreGet> gets, StoreDone done) override;
  void Exists(std::vector<StoreKey> keys, StoreExistsDone done) override;
  void Remove(std::vector<StoreKey> keys, StoreDone done) override;
  PageStoreStats Stats() const override ABSL_LOCKS_EXCLUDED(mu_);

  // One command's reply, as the workers see it (internal; public for the
  // connection helper in the .cc).
  struct Reply;
  class Connection;

 private:
  using Job = std::function<void(Connection&)>;

  explicit RedisPageStore(RedisPageStoreOptions options);
  void Submit(Job job) ABSL_LOCKS_EXCLUDED(mu_);
  // Submits work(connection, items, done) for one operation's batch.
  template <typename Item, typename Done, typename Work>
  void SubmitBatch(std::vector<Item> items, Done done, Work work)
      ABSL_LOCKS_EXCLUDED(mu_);
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  std::string KeyName(const StoreKey& key) const;
  // `verb key` for each key (EXISTS, DEL).
  std::vector<std::vector<std::string>> KeyCommands(
      const char* verb, const std::vector<StoreKey>& keys) const;
  void Count(const std::function<void(PageStoreStats&)>& update) const
      ABSL_LOCKS_EXCLUDED(mu_);

  const RedisPageStoreOptions options_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  mutable PageStoreStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> workers_;
};

}  // namespace hicache
