#include "daemon/group/step_completer.h"

#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace hicache::group {
namespace {

std::vector<StepDone> Steps(uint64_t op, int n) {
  std::vector<StepDone> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(StepDone{.op_id = op,
                           .step = static_cast<uint32_t>(i),
                           .status = absl::UnavailableError("gone")});
  }
  return out;
}

TEST(StepCompleterTest, DeliversInOrderOffTheCallersThread) {
  std::mutex mu;
  std::vector<StepDone> got;
  bool on_caller = false;
  const std::thread::id caller = std::this_thread::get_id();
  StepCompleter completer([&](StepDone done) {
    std::lock_guard<std::mutex> lock(mu);
    on_caller |= std::this_thread::get_id() == caller;
    got.push_back(std::move(done));
  });
  completer.Complete(Steps(1, 5));
  completer.Complete({});
  completer.Complete(Steps(2, 5));
  completer.Drain();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(got.size(), 10u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].op_id, i / 5 + 1);
    EXPECT_EQ(got[i].step, i % 5);
  }
  EXPECT_FALSE(on_caller);
  EXPECT_EQ(completer.delivered(), 10);
}

TEST(StepCompleterTest, DrainWaitsForTheDeliveryToReturn) {
  std::promise<void> entered;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  StepCompleter completer([&](StepDone) {
    entered.set_value();
    released.wait();
  });
  completer.Complete(Steps(1, 1));
  entered.get_future().wait();
  std::future<void> drained =
      std::async(std::launch::async, [&] { completer.Drain(); });
  EXPECT_EQ(drained.wait_for(std::chrono::milliseconds(50)),
            std::future_status::timeout);
  release.set_value();
  drained.get();
  EXPECT_EQ(completer.delivered(), 1);
}

TEST(StepCompleterTest, DestructorDeliversWhatIsQueued) {
  std::mutex mu;
  int got = 0;
  {
    StepCompleter completer([&](StepDone) {
      std::lock_guard<std::mutex> lock(mu);
      ++got;
    });
    completer.Complete(Steps(1, 100));
  }
  EXPECT_EQ(got, 100);
}

TEST(StepCompleterTest, CopyStatusKeepsCodeAndMessage) {
  const absl::Status s = absl::DataLossError("bad frame");
  const absl::Status c = CopyStatus(s);
  EXPECT_EQ(c, s);
  EXPECT_TRUE(CopyStatus(absl::OkStatus()).ok());
}

}  // namespace
}  // namespace hicache::group
