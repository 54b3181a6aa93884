#include "daemon/core/mutex.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace hicache {
namespace {

struct Counter {
  Mutex mu;
  int64_t value ABSL_GUARDED_BY(mu) = 0;
};

TEST(MutexTest, ExclusiveLockSerializesIncrements) {
  Counter counter;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&counter] {
      for (int i = 0; i < 10000; ++i) {
        MutexLock lock(&counter.mu);
        ++counter.value;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  MutexLock lock(&counter.mu);
  EXPECT_EQ(counter.value, 40000);
}

TEST(MutexTest, ReadersShareTheLock) {
  Mutex mu;
  ReaderMutexLock first(&mu);
  std::thread other([&mu] {
    ReaderMutexLock second(&mu);  // Would deadlock if readers excluded.
  });
  other.join();
  EXPECT_FALSE(mu.TryLock());  // A writer must wait for the reader.
}

TEST(MutexTest, TryLock) {
  Mutex mu;
  if (mu.TryLock()) {
    std::thread other([&mu] { EXPECT_FALSE(mu.TryLock()); });
    other.join();
    mu.Unlock();
  } else {
    ADD_FAILURE() << "TryLock on a free mutex failed";
  }
}

TEST(CondVarTest, WaitWakesOnSignal) {
  Mutex mu;
  CondVar cv;
  bool ready = false;
  std::thread producer([&] {
    MutexLock lock(&mu);
    ready = true;
    cv.SignalAll();
  });
  {
    MutexLock lock(&mu);
    while (!ready) cv.Wait(&mu);
    EXPECT_TRUE(ready);
  }
  producer.join();
}

TEST(CondVarTest, WaitWithTimeoutTimesOut) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(&mu);
  EXPECT_TRUE(cv.WaitWithTimeout(&mu, absl::Milliseconds(10)));
}

}  // namespace
}  // namespace hicache
