#include "daemon/group/rendezvous_kv.h"

#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace hicache::group {
namespace {

TEST(RendezvousKvTest, SetThenGet) {
  InMemoryRendezvousKv kv;
  ASSERT_TRUE(kv.Set("cp/g/1/a/0", "addr0").ok());
  auto v = kv.Get("cp/g/1/a/0", absl::ZeroDuration());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "addr0");
  EXPECT_EQ(kv.num_keys(), 1u);
  EXPECT_EQ(kv.total_bytes(), std::string("cp/g/1/a/0addr0").size());
}

TEST(RendezvousKvTest, MissingKeyIsNotFoundAtOnceWithoutWait) {
  InMemoryRendezvousKv kv;
  auto v = kv.Get("nope", absl::ZeroDuration());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kNotFound);
}

TEST(RendezvousKvTest, WaitEndsAtDeadline) {
  InMemoryRendezvousKv kv;
  const absl::Time start = absl::Now();
  auto v = kv.Get("nope", absl::Milliseconds(50));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kNotFound);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_EQ(kv.num_waiters(), 0u);
}

TEST(RendezvousKvTest, WaitIsCappedByMaxWait) {
  RendezvousKvLimits limits;
  limits.max_wait = absl::Milliseconds(20);
  InMemoryRendezvousKv kv(limits);
  const absl::Time start = absl::Now();
  auto v = kv.Get("nope", absl::Hours(1));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kNotFound);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

TEST(RendezvousKvTest, WaiterWakesWhenKeyIsSet) {
  InMemoryRendezvousKv kv;
  auto waiter = std::async(std::launch::async,
                           [&kv] { return kv.Get("k", absl::Seconds(60)); });
  // Set from this thread; the waiter either is already blocked or finds the
  // key when it looks: both must give the value, long before 60 s.
  const absl::Time start = absl::Now();
  ASSERT_TRUE(kv.Set("k", "v").ok());
  auto v = waiter.get();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "v");
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

TEST(RendezvousKvTest, SameValueAgainIsOkOtherValueIsRefused) {
  InMemoryRendezvousKv kv;
  ASSERT_TRUE(kv.Set("k", "v").ok());
  EXPECT_TRUE(kv.Set("k", "v").ok());
  EXPECT_EQ(kv.Set("k", "w").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(*kv.Get("k", absl::ZeroDuration()), "v");
  EXPECT_EQ(kv.num_keys(), 1u);
  EXPECT_EQ(kv.total_bytes(), 2u);
}

TEST(RendezvousKvTest, EmptyKeyIsInvalid) {
  InMemoryRendezvousKv kv;
  EXPECT_EQ(kv.Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Get("", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RendezvousKvTest, BoundsRefuseWithoutChange) {
  RendezvousKvLimits limits;
  limits.max_key_bytes = 8;
  limits.max_value_bytes = 16;
  limits.max_keys = 3;
  limits.max_total_bytes = 40;
  InMemoryRendezvousKv kv(limits);
  EXPECT_EQ(kv.Set(std::string(9, 'k'), "v").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv.Get(std::string(9, 'k'), absl::ZeroDuration()).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv.Set("k", std::string(17, 'v')).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(kv.Set("a", std::string(16, 'v')).ok());  // 17 bytes
  ASSERT_TRUE(kv.Set("b", std::string(16, 'v')).ok());  // 34 bytes
  // 34 + 7 > 40.
  EXPECT_EQ(kv.Set("c", std::string(6, 'v')).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(kv.Set("c", std::string(5, 'v')).ok());  // 40 bytes, 3 keys
  EXPECT_EQ(kv.Set("d", "").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv.num_keys(), 3u);
  EXPECT_EQ(kv.total_bytes(), 40u);
  EXPECT_EQ(kv.Get("d", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(RendezvousKvTest, EraseUnderPrefixReclaims) {
  RendezvousKvLimits limits;
  limits.max_keys = 2;
  InMemoryRendezvousKv kv(limits);
  ASSERT_TRUE(kv.Set("cp/g/1/a/0", "x").ok());
  ASSERT_TRUE(kv.Set("cp/g/1/a/1", "y").ok());
  EXPECT_EQ(kv.Set("cp/g/2/a/0", "z").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv.EraseUnderPrefix(""), 0u);
  EXPECT_EQ(kv.EraseUnderPrefix("cp/g/2/"), 0u);
  EXPECT_EQ(kv.EraseUnderPrefix("cp/g/1/"), 2u);
  EXPECT_EQ(kv.num_keys(), 0u);
  EXPECT_EQ(kv.total_bytes(), 0u);
  EXPECT_TRUE(kv.Set("cp/g/2/a/0", "z").ok());
}

TEST(RendezvousKvTest, TooManyWaitersAreRefused) {
  RendezvousKvLimits limits;
  limits.max_waiters = 1;
  InMemoryRendezvousKv kv(limits);
  auto waiter = std::async(std::launch::async,
                           [&kv] { return kv.Get("k", absl::Seconds(60)); });
  // Wait (on the store's own condition) until the first waiter is in.
  while (kv.num_waiters() == 0) std::this_thread::yield();
  EXPECT_EQ(kv.Get("other", absl::Seconds(1)).status().code(),
            absl::StatusCode::kResourceExhausted);
  // A Get without wait does not count as a waiter.
  EXPECT_EQ(kv.Get("other", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(kv.Set("k", "v").ok());
  EXPECT_EQ(*waiter.get(), "v");
}

TEST(RendezvousKvTest, ShutdownCancelsWaiters) {
  InMemoryRendezvousKv kv;
  auto waiter = std::async(std::launch::async,
                           [&kv] { return kv.Get("k", absl::Seconds(60)); });
  while (kv.num_waiters() == 0) std::this_thread::yield();
  kv.Shutdown();
  EXPECT_EQ(waiter.get().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(kv.Set("k", "v").code(), absl::StatusCode::kCancelled);
}

TEST(RendezvousKvTest, DestructorWaitsForWaiters) {
  auto kv = std::make_unique<InMemoryRendezvousKv>();
  auto waiter = std::async(std::launch::async, [p = kv.get()] {
    return p->Get("k", absl::Seconds(60)).status().code();
  });
  while (kv->num_waiters() == 0) std::this_thread::yield();
  kv.reset();  // Must not free the store under the waiter.
  EXPECT_EQ(waiter.get(), absl::StatusCode::kCancelled);
}

TEST(RendezvousKvTest, ConcurrentSettersAndWaiters) {
  InMemoryRendezvousKv kv;
  constexpr int kKeys = 32;
  std::vector<std::future<absl::StatusOr<std::string>>> waiters;
  for (int i = 0; i < kKeys; ++i) {
    waiters.push_back(std::async(std::launch::async, [&kv, i] {
      return kv.Get("key" + std::to_string(i), absl::Seconds(60));
    }));
  }
  std::vector<std::thread> setters;
  for (int t = 0; t < 4; ++t) {
    setters.emplace_back([&kv, t] {
      for (int i = t; i < kKeys; i += 4) {
        ASSERT_TRUE(
            kv.Set("key" + std::to_string(i), "v" + std::to_string(i)).ok());
      }
    });
  }
  for (auto& s : setters) s.join();
  for (int i = 0; i < kKeys; ++i) {
    auto v = waiters[i].get();
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, "v" + std::to_string(i));
  }
  EXPECT_EQ(kv.num_keys(), size_t{kKeys});
}

}  // namespace
}  // namespace hicache::group
