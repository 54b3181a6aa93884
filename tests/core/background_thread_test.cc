// BackgroundWorker runs what it is handed on its own thread, in the
// background scheduling class, and returns when the work has; and
// RunAsBackgroundThread lowers the calling thread's class.
#include "daemon/core/background_thread.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace hicache {
namespace {

// SCHED_IDLE, or (where that is refused) nice 19.
bool InBackgroundClass() {
  if (sched_getscheduler(0) == SCHED_IDLE) return true;
  errno = 0;
  return getpriority(PRIO_PROCESS, static_cast<id_t>(gettid())) == 19;
}

TEST(BackgroundWorkerTest, RunsOnItsOwnBackgroundThreadAndWaits) {
  BackgroundWorker worker("test");
  std::thread::id ran_on;
  bool background = false;
  int value = 0;
  worker.Run([&] {
    ran_on = std::this_thread::get_id();
    background = InBackgroundClass();
    value = 42;  // Seen by the caller once Run returns.
  });
  EXPECT_EQ(value, 42);
  EXPECT_NE(ran_on, std::this_thread::get_id());
  EXPECT_TRUE(background);
  EXPECT_FALSE(InBackgroundClass());  // The caller's class is untouched.
}

TEST(BackgroundWorkerTest, RunsOneAfterAnotherInOrder) {
  BackgroundWorker worker("test");
  std::vector<int> order;
  for (int i = 0; i < 100; ++i) worker.Run([&] { order.push_back(i); });
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(BackgroundWorkerTest, StopsWhenDestroyedUnused) {
  for (int i = 0; i < 20; ++i) BackgroundWorker worker("test");
}

// kLow: nice 10 in the normal class, a small fair share even when every
// core is busy (what the journal needs to keep up).
TEST(RunAsBackgroundThreadTest, LowClassIsNiceTen) {
  std::atomic<int> nice{0};
  std::atomic<int> policy{-1};
  std::thread([&] {
    RunAsBackgroundThread("test", BackgroundClass::kLow);
    errno = 0;
    nice = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
    policy = sched_getscheduler(0);
  }).join();
  EXPECT_EQ(nice.load(), 10);
  EXPECT_EQ(policy.load(), SCHED_OTHER);
  BackgroundWorker worker("test", BackgroundClass::kLow);
  int seen = 0;
  worker.Run([&] {
    seen = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  });
  EXPECT_EQ(seen, 10);
}

TEST(RunAsBackgroundThreadTest, LowersTheCallingThreadOnly) {
  std::atomic<bool> lowered{false};
  std::thread([&] {
    RunAsBackgroundThread("test");
    lowered = InBackgroundClass();
  }).join();
  EXPECT_TRUE(lowered.load());
  EXPECT_FALSE(InBackgroundClass());
}

}  // namespace
}  // namespace hicache
