// TailLearner: the median unshared end of cached requests, in pages.
#include "daemon/radix/tail_learner.h"

#include "gtest/gtest.h"

namespace hicache {
namespace {

TEST(TailLearnerTest, NothingLearnedBeforeEnoughObservations) {
  TailLearner learner;
  EXPECT_EQ(learner.TailPages(), 0);
  for (int i = 0; i < TailLearner::kMinObservations - 1; ++i) {
    learner.Observe(8);
  }
  EXPECT_EQ(learner.TailPages(), 0);
  learner.Observe(8);
  EXPECT_EQ(learner.TailPages(), 8);
}

TEST(TailLearnerTest, TheMedianWinsOverOutliers) {
  TailLearner learner;
  for (int i = 0; i < 60; ++i) learner.Observe(8);
  for (int i = 0; i < 20; ++i) learner.Observe(1);
  for (int i = 0; i < 30; ++i) learner.Observe(500);  // Long: no tail.
  EXPECT_EQ(learner.TailPages(), 8);
}

TEST(TailLearnerTest, MostlyLongRemaindersLearnNoTail) {
  TailLearner learner;
  for (int i = 0; i < 40; ++i) learner.Observe(TailLearner::kMaxPages + 1);
  for (int i = 0; i < 30; ++i) learner.Observe(2);
  EXPECT_EQ(learner.TailPages(), 0);
}

TEST(TailLearnerTest, IgnoresEmptyRemaindersAndFollowsTheTraffic) {
  TailLearner learner;
  learner.Observe(0);
  learner.Observe(-3);
  EXPECT_EQ(learner.observations(), 0);
  for (int i = 0; i < TailLearner::kWindow; ++i) learner.Observe(4);
  EXPECT_EQ(learner.TailPages(), 4);
  EXPECT_LT(learner.observations(), TailLearner::kWindow);  // Halved.
  // The traffic changes: after two windows of 1-page ends, 1 page wins.
  for (int i = 0; i < 2 * TailLearner::kWindow; ++i) learner.Observe(1);
  EXPECT_EQ(learner.TailPages(), 1);
}

}  // namespace
}  // namespace hicache
