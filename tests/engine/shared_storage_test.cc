// Two engines (two daemons' caches, C = 2 each, the default policies) on
// one shared store (a private redis-server): engine B finds and loads the
// prefixes engine A stored, byte-exact, while both keep serving at once.
#include <memory>
#include <thread>
#include <vector>

#include "daemon/engine/hicache_engine.h"
#include "daemon/storage/redis_page_store.h"
#include "gtest/gtest.h"
#include "tests/engine/request_driver.h"
#include "tests/testing/redis_server.h"

namespace hicache {
namespace {

using Driver = testing::RequestDriver;

constexpr uint32_t kP = Driver::kPageSize;
constexpr uint32_t kCp = 2;

std::unique_ptr<HiCacheEngine> MakeEngine(PageStore* store) {
  EngineOptions o;
  o.page_size = kP;
  o.cp_size = kCp;
  o.kv_preset = "tiny-draft";
  o.device_pages_per_rank = 1 + 48 / kCp;
  o.host_pages_per_rank = 1 + 64 / kCp;
  o.l1_free_room_pages = 1;
  o.l2_free_room_pages = 1;
  o.write_ahead_thread = false;
  o.storage_recompute_ns_per_token = 0;  // Bytes, not timing, are checked.
  o.storage = std::vector<PageStore*>(kCp, store);
  auto engine = HiCacheEngine::Create(o);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

std::unique_ptr<RedisPageStore> OpenStore(const testing::RedisServer& server) {
  const KvGeometry g = *KvGeometry::Preset("tiny-draft", kP);
  auto store = RedisPageStore::Open(
      {.address = server.address(),
       .page_bytes = static_cast<int64_t>(g.BytesPerPage())});
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

void Drive(HiCacheEngine& engine, Driver& driver, int requests) {
  for (int step = 0; step < requests; ++step) {
    ASSERT_NO_FATAL_FAILURE(driver.Request()) << "step " << step;
    engine.storage()->Flush();
    ASSERT_TRUE(engine.CheckInvariants().ok()) << "step " << step;
  }
}

TEST(SharedStorageTest, AnotherEngineLoadsWhatOneStored) {
  auto server = testing::RedisServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  auto store_a = OpenStore(**server);
  auto store_b = OpenStore(**server);
  ASSERT_NE(store_a, nullptr);
  ASSERT_NE(store_b, nullptr);
  auto a = MakeEngine(store_a.get());
  auto b = MakeEngine(store_b.get());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  // A serves alone first, then both at once: B repeats A's earlier
  // requests (the same seed), A goes on with new ones.
  Driver first(a.get(), 77, "");
  ASSERT_NO_FATAL_FAILURE(Drive(*a, first, 300));
  Driver again(b.get(), 77, "");
  Driver more(a.get(), 78, "");
  std::thread ta([&] { Drive(*a, more, 300); });
  std::thread tb([&] { Drive(*b, again, 300); });
  ta.join();
  tb.join();
  EXPECT_FALSE(::testing::Test::HasFailure());
  const EngineStats sb = b->Stats();
  EXPECT_GT(sb.storage_promoted_pages, 0) << "B never loaded A's pages";
  EXPECT_GT(again.counts().verified, 0);
  EXPECT_EQ(b->storage()->StoreStats().checksum_failures, 0);
  for (HiCacheEngine* e : {a.get(), b.get()}) {
    e->WaitForTransfers();
    EXPECT_TRUE(e->CheckInvariants().ok());
    EXPECT_EQ(e->DeviceAllocatedPages(), e->TreeDevicePages());
  }
}

}  // namespace
}  // namespace hicache
