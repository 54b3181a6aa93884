#include "daemon/storage/redis_page_store.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <xxhash.h>

#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/core/le_bytes.h"

namespace hicache {
namespace {

constexpr size_t kHeaderBytes = 16;  // Checksum u64, length u64.
constexpr int kSlots = 16384;        // Redis Cluster's hash slots.

// CRC16-CCITT (XMODEM), the Redis Cluster key-slot hash (cluster spec).
uint16_t Crc16(absl::string_view bytes) {
  uint16_t crc = 0;
  for (unsigned char b : bytes) {
    crc ^= static_cast<uint16_t>(b) << 8;
    for (int i = 0; i < 8; ++i) {
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<uint16_t>(crc << 1);
    }
  }
  return crc;
}

// A write to a connection the server closed raises SIGPIPE in the writing
// thread; hiredis does not ask the kernel not to. The store's threads block
// it, so such a write fails with EPIPE (a broken connection, reopened on
// the next batch) instead of killing the process.
void BlockSigpipe() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int SlotOf(absl::string_view key) {
  // Our keys carry no hash tag ("{...}"): the whole key is hashed.
  return Crc16(key) % kSlots;
}

}  // namespace

struct RedisPageStore::Reply {
  enum class Kind { kString, kNil, kInteger, kStatus, kError, kBroken };
  Kind kind = Kind::kBroken;
  std::string str;  // kString, kStatus, kError; kBroken: why.
  int64_t integer = 0;
};

// The connections of one worker: the configured server, and the cluster
// nodes MOVED and ASK replies named, with the slots learned from MOVED.
class RedisPageStore::Connection {
 public:
  explicit Connection(const RedisPageStoreOptions& options)
      : options_(options) {}
  ~Connection() {
    for (auto& [address, context] : nodes_) {
      if (context != nullptr) redisFree(context);
    }
  }

  // Runs each command (argv) and returns its reply, pipelined per node.
  // A command's key, for cluster routing, is its first argument.
  std::vector<Reply> Run(
      const std::vector<std::vector<std::string>>& commands) {
    std::vector<Reply> replies(commands.size());
    std::map<std::string, std::vector<size_t>> by_node;
    for (size_t i = 0; i < commands.size(); ++i) {
      const std::string& key =
          commands[i].size() > 1 ? commands[i][1] : std::string();
      auto it = slots_.find(SlotOf(key));
      by_node[it == slots_.end() ? options_.address : it->second].push_back(i);
    }
    for (const auto& [address, items] : by_node) {
      RunOn(address, commands, items, &replies, /*asking=*/false);
    }
    // Follow redirections one command at a time (at most 5 hops each).
    for (size_t i = 0; i < commands.size(); ++i) {
      for (int hop = 0; hop < 5 && replies[i].kind == Reply::Kind::kError;
           ++hop) {
        const std::vector<absl::string_view> parts =
            absl::StrSplit(replies[i].str, ' ');
        const bool moved = parts.size() == 3 && parts[0] == "MOVED";
        const bool ask = parts.size() == 3 && parts[0] == "ASK";
        if (!moved && !ask) break;
        const std::string target(parts[2]);
        int slot = 0;
        if (moved && absl::SimpleAtoi(parts[1], &slot)) slots_[slot] = target;
        RunOn(target, commands, {i}, &replies, /*asking=*/ask);
      }
    }
    return replies;
  }

 private:
  redisContext* Context(const std::string& address, std::string* why) {
    redisContext*& context = nodes_[address];
    if (context != nullptr && context->err != 0) {
      redisFree(context);
      context = nullptr;
    }
    if (context != nullptr) return context;
    absl::string_view a = address;
    if (absl::ConsumePrefix(&a, "unix:")) {
      context = redisConnectUnixWithTimeout(std::string(a).c_str(),
                                            absl::ToTimeval(options_.timeout));
    } else {
      absl::ConsumePrefix(&a, "redis://");
      const size_t colon = a.rfind(':');
      int port = 0;
      if (colon == absl::string_view::npos ||
          !absl::SimpleAtoi(a.substr(colon + 1), &port)) {
        *why = absl::StrCat("bad Redis address '", address, "'");
        return nullptr;
      }
      context =
          redisConnectWithTimeout(std::string(a.substr(0, colon)).c_str(), port,
                                  absl::ToTimeval(options_.timeout));
    }
    if (context == nullptr || context->err != 0) {
      *why = absl::StrCat("connecting to Redis at ", address, ": ",
                          context != nullptr ? context->errstr : "no memory");
      if (context != nullptr) redisFree(context);
      context = nullptr;
      return nullptr;
    }
    redisSetTimeout(context, absl::ToTimeval(options_.timeout));
    return context;
  }

  // Runs `items` on the node at `address`. A connection that broke since
  // its last use (the server restarted, or closed it idle) is reopened and
  // the items run once more: every command here is idempotent.
  void RunOn(const std::string& address,
             const std::vector<std::vector<std::string>>& commands,
             const std::vector<size_t>& items, std::vector<Reply>* replies,
             bool asking) {
    const bool reused = nodes_.count(address) > 0 && nodes_[address] != nullptr;
    if (RunOnce(address, commands, items, replies, asking) || !reused) return;
    RunOnce(address, commands, items, replies, asking);
  }

  // False when the connection broke (the replies say why).
  bool RunOnce(const std::string& address,
               const std::vector<std::vector<std::string>>& commands,
               const std::vector<size_t>& items, std::vector<Reply>* replies,
               bool asking) {
    std::string why;
    redisContext* c = Context(address, &why);
    auto broken = [&](const std::string& reason) {
      for (size_t i : items)
        (*replies)[i] = Reply{Reply::Kind::kBroken, reason};
      return false;
    };
    if (c == nullptr) return broken(why);
    for (size_t i : items) {
      if (asking) {
        redisAppendCommand(c, "ASKING");
      }
      std::vector<const char*> argv;
      std::vector<size_t> lengths;
      for (const std::string& arg : commands[i]) {
        argv.push_back(arg.data());
        lengths.push_back(arg.size());
      }
      redisAppendCommandArgv(c, static_cast<int>(argv.size()), argv.data(),
                             lengths.data());
    }
    for (size_t i : items) {
      if (asking) {
        void* ignored = nullptr;
        if (redisGetReply(c, &ignored) != REDIS_OK) {
          return broken(absl::StrCat("Redis at ", address, ": ", c->errstr));
        }
        freeReplyObject(ignored);
      }
      void* raw = nullptr;
      if (redisGetReply(c, &raw) != REDIS_OK || raw == nullptr) {
        return broken(absl::StrCat("Redis at ", address, ": ", c->errstr));
      }
      auto* r = static_cast<redisReply*>(raw);
      Reply& out = (*replies)[i];
      switch (r->type) {
        case REDIS_REPLY_STRING:
          out = {Reply::Kind::kString, std::string(r->str, r->len)};
          break;
        case REDIS_REPLY_NIL:
          out = {Reply::Kind::kNil};
          break;
        case REDIS_REPLY_INTEGER:
          out = {Reply::Kind::kInteger, "", r->integer};
          break;
        case REDIS_REPLY_STATUS:
          out = {Reply::Kind::kStatus, std::string(r->str, r->len)};
          break;
        case REDIS_REPLY_ERROR:
          out = {Reply::Kind::kError, std::string(r->str, r->len)};
          break;
        default:
          out = {Reply::Kind::kBroken, "unexpected Redis reply type"};
      }
      freeReplyObject(r);
    }
    return true;
  }

  const RedisPageStoreOptions& options_;
  std::map<std::string, redisContext*> nodes_;
  std::map<int, std::string> slots_;
};

absl::StatusOr<std::unique_ptr<RedisPageStore>> RedisPageStore::Open(
    RedisPageStoreOptions options) {
  if (options.address.empty() || options.page_bytes < 1 ||
      options.connections < 1 || options.connections > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a Redis store needs an address, pages of at least 1 byte and 1 to "
        "64 connections (got '",
        options.address, "', ", options.page_bytes, " bytes, ",
        options.connections, " connections)"));
  }
  Reply pong;
  std::thread probe([&options, &pong] {  // Its own thread: SIGPIPE blocked.
    BlockSigpipe();
    Connection connection(options);
    pong = connection.Run({{"PING"}})[0];
  });
  probe.join();
  if (pong.kind != Reply::Kind::kStatus) {
    return absl::UnavailableError(absl::StrCat("the Redis store at ",
                                               options.address,
                                               " does not answer: ", pong.str));
  }
  std::unique_ptr<RedisPageStore> store(new RedisPageStore(std::move(options)));
  for (int i = 0; i < store->options_.connections; ++i) {
    store->workers_.emplace_back([p = store.get()] { p->WorkerLoop(); });
  }
  return store;
}

RedisPageStore::RedisPageStore(RedisPageStoreOptions options)
    : options_(std::move(options)) {}

RedisPageStore::~RedisPageStore() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  for (std::thread& t : workers_) t.join();
}

std::string RedisPageStore::Describe() const {
  return absl::StrCat("redis ", options_.address, " (keys ",
                      options_.key_prefix, "*, ", options_.connections,
                      " connections)");
}

std::string RedisPageStore::KeyName(const StoreKey& key) const {
  return absl::StrCat(options_.key_prefix, key.ToHex());
}

std::vector<std::vector<std::string>> RedisPageStore::KeyCommands(
    const char* verb, const std::vector<StoreKey>& keys) const {
  std::vector<std::vector<std::string>> commands;
  commands.reserve(keys.size());
  for (const StoreKey& key : keys) commands.push_back({verb, KeyName(key)});
  return commands;
}

template <typename Item, typename Done, typename Work>
void RedisPageStore::SubmitBatch(std::vector<Item> items, Done done,
                                 Work work) {
  auto batch = std::make_shared<std::pair<std::vector<Item>, Done>>(
      std::move(items), std::move(done));
  Submit([batch, work](Connection& connection) {
    work(connection, batch->first, std::move(batch->second));
  });
}

void RedisPageStore::Submit(Job job) {
  MutexLock lock(&mu_);
  queue_.push_back(std::move(job));
  cv_.Signal();
}

void RedisPageStore::WorkerLoop() {
  BlockSigpipe();
  Connection connection(options_);
  while (true) {
    Job job;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stop_) cv_.Wait(&mu_);
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job(connection);
  }
}

void RedisPageStore::Count(
    const std::function<void(PageStoreStats&)>& update) const {
  MutexLock lock(&mu_);
  update(stats_);
}

PageStoreStats RedisPageStore::Stats() const {
  MutexLock lock(&mu_);
  PageStoreStats s = stats_;
  s.capacity_pages = -1;
  s.used_pages = -1;
  return s;
}

void RedisPageStore::Put(std::vector<StorePut> puts, StoreDone done) {
  SubmitBatch(
      std::move(puts), std::move(done),
      [this](Connection& connection, std::vector<StorePut>& items,
             StoreDone done) {
        std::vector<absl::Status> results(items.size());
        std::vector<std::vector<std::string>> commands;
        std::vector<size_t> sent;
        for (size_t i = 0; i < items.size(); ++i) {
          const absl::Span<const uint8_t> bytes = items[i].bytes;
          results[i] = CheckPageBytes(bytes.size(), options_.page_bytes);
          if (!results[i].ok()) continue;
          std::string value;
          value.reserve(kHeaderBytes + bytes.size());
          LeWriter w(&value);
          w.U64(XXH3_64bits(bytes.data(), bytes.size()));
          w.U64(bytes.size());
          w.Bytes(absl::string_view(reinterpret_cast<const char*>(bytes.data()),
                                    bytes.size()));
          commands.push_back({"SET", KeyName(items[i].key), std::move(value)});
          sent.push_back(i);
        }
        const std::vector<Reply> replies = connection.Run(commands);
        int64_t ok = 0, failed = 0;
        for (size_t j = 0; j < sent.size(); ++j) {
          if (replies[j].kind == Reply::Kind::kStatus) {
            ++ok;
          } else {
            results[sent[j]] = absl::UnavailableError(
                absl::StrCat("Redis SET: ", replies[j].str));
            ++failed;
          }
        }
        Count([&](PageStoreStats& s) {
          s.puts += ok;
          s.put_bytes += ok * options_.page_bytes;
          s.put_errors +=
              failed + static_cast<int64_t>(items.size() - sent.size());
        });
        std::move(done)(std::move(results));
      });
}

void RedisPageStore::Get(std::vector<StoreGet> gets, StoreDone done) {
  SubmitBatch(
      std::move(gets), std::move(done),
      [this](Connection& connection, std::vector<StoreGet>& items,
             StoreDone done) {
        std::vector<absl::Status> results(items.size());
        std::vector<std::vector<std::string>> commands;
        std::vector<size_t> sent;
        for (size_t i = 0; i < items.size(); ++i) {
          results[i] =
              CheckPageBytes(items[i].bytes.size(), options_.page_bytes);
          if (!results[i].ok()) continue;
          commands.push_back({"GET", KeyName(items[i].key)});
          sent.push_back(i);
        }
        const std::vector<Reply> replies = connection.Run(commands);
        int64_t hits = 0, misses = 0, corrupt = 0, errors = 0;
        std::vector<std::vector<std::string>> deletes;
        for (size_t j = 0; j < sent.size(); ++j) {
          absl::Status& r = results[sent[j]];
          const Reply& reply = replies[j];
          if (reply.kind == Reply::Kind::kNil) {
            r = absl::NotFoundError("not in the Redis store");
            ++misses;
            continue;
          }
          if (reply.kind != Reply::Kind::kString) {
            r = absl::UnavailableError(absl::StrCat("Redis GET: ", reply.str));
            ++errors;
            continue;
          }
          LeReader in(reply.str);
          uint64_t checksum = 0, length = 0;
          const bool framed =
              in.U64(&checksum) && in.U64(&length) &&
              length == static_cast<uint64_t>(options_.page_bytes) &&
              in.remaining() == length;
          const char* data = reply.str.data() + kHeaderBytes;
          if (!framed || XXH3_64bits(data, length) != checksum) {
            r = absl::DataLossError(
                "the stored page failed its checksum or length; treated as a "
                "miss");
            ++corrupt;
            deletes.push_back({"DEL", commands[j][1]});
            continue;
          }
          std::memcpy(items[sent[j]].bytes.data(), data, length);
          ++hits;
        }
        if (!deletes.empty()) connection.Run(deletes);
        Count([&](PageStoreStats& s) {
          s.gets += static_cast<int64_t>(items.size());
          s.get_hits += hits;
          s.get_misses += misses;
          s.checksum_failures += corrupt;
          s.get_errors += errors;
          s.get_bytes += hits * options_.page_bytes;
        });
        std::move(done)(std::move(results));
      });
}

void RedisPageStore::Exists(std::vector<StoreKey> keys, StoreExistsDone done) {
  SubmitBatch(std::move(keys), std::move(done),
              [this](Connection& connection, std::vector<StoreKey>& items,
                     StoreExistsDone done) {
                const std::vector<Reply> replies =
                    connection.Run(KeyCommands("EXISTS", items));
                std::vector<bool> found(items.size());
                for (size_t i = 0; i < items.size(); ++i) {
                  found[i] = replies[i].kind == Reply::Kind::kInteger &&
                             replies[i].integer == 1;
                }
                std::move(done)(std::move(found));
              });
}

void RedisPageStore::Remove(std::vector<StoreKey> keys, StoreDone done) {
  SubmitBatch(std::move(keys), std::move(done),
              [this](Connection& connection, std::vector<StoreKey>& items,
                     StoreDone done) {
                const std::vector<Reply> replies =
                    connection.Run(KeyCommands("DEL", items));
                std::vector<absl::Status> results(items.size());
                int64_t removed = 0;
                for (size_t i = 0; i < items.size(); ++i) {
                  if (replies[i].kind == Reply::Kind::kInteger) {
                    removed += replies[i].integer;
                  } else {
                    results[i] = absl::UnavailableError(
                        absl::StrCat("Redis DEL: ", replies[i].str));
                  }
                }
                Count([&](PageStoreStats& s) { s.removes += removed; });
                std::move(done)(std::move(results));
              });
}

}  // namespace hicache
