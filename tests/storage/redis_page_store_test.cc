// RedisPageStore against a real redis-server (Debian's, on a unix socket):
// the PageStore contract, a corrupted value is a miss that is deleted, a
// server that goes away fails operations (UNAVAILABLE) without breaking the
// store, which reconnects once the server is back, and concurrent traffic.
#include "daemon/storage/redis_page_store.h"

#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/redis_server.h"

namespace hicache {
namespace {

constexpr int64_t kPageBytes = 3000;

StoreKey Key(uint64_t i) { return StoreKey{i * 31 + 7, i}; }

std::vector<uint8_t> PageOf(uint64_t i) {
  std::vector<uint8_t> page(kPageBytes);
  std::mt19937_64 rng(i);
  for (auto& b : page) b = static_cast<uint8_t>(rng());
  return page;
}

class RedisPageStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = testing::RedisServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto store = RedisPageStore::Open({.address = server_->address(),
                                       .key_prefix = "t:",
                                       .page_bytes = kPageBytes,
                                       .connections = 2,
                                       .timeout = absl::Seconds(5)});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  absl::Status PutPage(uint64_t id) {
    const std::vector<uint8_t> page = PageOf(id);
    return PutAndWait(*store_, {{Key(id), page}})[0];
  }
  absl::Status GetPage(uint64_t id) {
    std::vector<uint8_t> out(kPageBytes);
    absl::Status s = GetAndWait(*store_, {{Key(id), absl::MakeSpan(out)}})[0];
    if (s.ok() && out != PageOf(id)) return absl::InternalError("WRONG BYTES");
    return s;
  }

  std::unique_ptr<testing::RedisServer> server_;
  std::unique_ptr<RedisPageStore> store_;
};

TEST_F(RedisPageStoreTest, StoresAndReturnsPagesByteExact) {
  for (uint64_t id : {1, 2, 3}) ASSERT_TRUE(PutPage(id).ok());
  for (uint64_t id : {1, 2, 3}) EXPECT_TRUE(GetPage(id).ok()) << id;
  EXPECT_EQ(GetPage(9).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ExistsAndWait(*store_, {Key(1), Key(9)}),
            (std::vector<bool>{true, false}));
  EXPECT_TRUE(RemoveAndWait(*store_, {Key(2), Key(99)})[0].ok());
  EXPECT_EQ(GetPage(2).code(), absl::StatusCode::kNotFound);
  // The value lives under the prefix and the key's hex.
  EXPECT_EQ(*server_->Command({"EXISTS", "t:" + Key(1).ToHex()}), "1");
  const PageStoreStats s = store_->Stats();
  EXPECT_EQ(s.puts, 3);
  EXPECT_EQ(s.get_hits, 3);
  EXPECT_EQ(s.get_misses, 2);
  EXPECT_EQ(s.removes, 1);
  EXPECT_EQ(s.capacity_pages, -1);
}

TEST_F(RedisPageStoreTest, RefusesPagesOfTheWrongSize) {
  std::vector<uint8_t> small(10);
  EXPECT_EQ(PutAndWait(*store_, {{Key(1), small}})[0].code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetAndWait(*store_, {{Key(1), absl::MakeSpan(small)}})[0].code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*server_->Command({"DBSIZE"}), "0");
}

TEST_F(RedisPageStoreTest, ACorruptedValueIsAMissAndGoes) {
  ASSERT_TRUE(PutPage(1).ok());
  ASSERT_TRUE(PutPage(2).ok());
  const std::string k1 = "t:" + Key(1).ToHex(), k2 = "t:" + Key(2).ToHex();
  // Flip a byte of page 1's bytes; truncate page 2.
  std::string v = *server_->Command({"GET", k1});
  v[100] ^= 0x40;
  ASSERT_EQ(*server_->Command({"SET", k1, v}), "OK");
  ASSERT_EQ(*server_->Command({"SET", k2, "short"}), "OK");
  EXPECT_EQ(GetPage(1).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(GetPage(2).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(*server_->Command({"EXISTS", k1}), "0");
  EXPECT_EQ(GetPage(1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Stats().checksum_failures, 2);
}

TEST_F(RedisPageStoreTest, AServerThatGoesAwayFailsOperationsUntilItIsBack) {
  ASSERT_TRUE(PutPage(1).ok());
  server_->Kill();
  EXPECT_EQ(PutPage(2).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(GetPage(1).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ExistsAndWait(*store_, {Key(1)})[0], false);
  ASSERT_TRUE(server_->Restart().ok());
  // A new, empty server (no persistence): the store reconnects.
  EXPECT_EQ(GetPage(1).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(PutPage(3).ok());
  EXPECT_TRUE(GetPage(3).ok());
}

TEST_F(RedisPageStoreTest, OpenFailsWithoutAServer) {
  auto store = RedisPageStore::Open(
      {.address = "unix:/nonexistent/redis.sock", .page_bytes = kPageBytes});
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(
      RedisPageStore::Open({.address = "", .page_bytes = 1}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RedisPageStore::Open({.address = "nohost", .page_bytes = 1})
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(RedisPageStoreTest, ConcurrentTrafficNeverReturnsWrongBytes) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int step = 0; step < 200; ++step) {
        const uint64_t id = rng() % 32;
        switch (rng() % 3) {
          case 0:
            EXPECT_TRUE(PutPage(id).ok());
            break;
          case 1: {
            const absl::Status s = GetPage(id);
            EXPECT_TRUE(s.ok() || absl::IsNotFound(s)) << s;
            break;
          }
          case 2:
            RemoveAndWait(*store_, {Key(id)});
            break;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
}

}  // namespace
}  // namespace hicache
