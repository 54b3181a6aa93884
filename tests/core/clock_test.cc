#include "daemon/core/clock.h"

#include "gtest/gtest.h"

namespace hicache {
namespace {

TEST(ClockTest, FakeClockMovesOnlyWhenTold) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1000));
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1005));
  clock.Set(absl::FromUnixSeconds(7));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(7));
}

TEST(ClockTest, RealClockIsNearNowAndShared) {
  EXPECT_EQ(Clock::Real(), Clock::Real());
  const absl::Duration skew = Clock::Real()->Now() - absl::Now();
  EXPECT_LT(absl::AbsDuration(skew), absl::Seconds(5));
}

}  // namespace
}  // namespace hicache
