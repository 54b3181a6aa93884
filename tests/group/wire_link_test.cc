#include "daemon/group/wire_link.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/comm/loopback_communicator.h"
#include "gtest/gtest.h"

namespace hicache::group {
namespace {

using comm::LoopbackCommunicator;

// Both ends of a loopback link: `a` a WireLink, `b` raw (the test writes
// whatever bytes it likes into it).
class WireLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto [a, b] = LoopbackCommunicator::CreatePair("a", "b");
    raw_ = std::move(b);
    link_ = std::make_unique<WireLink>(std::move(a), 5);
  }
  void Start(absl::Status answer = absl::OkStatus()) {
    ASSERT_TRUE(link_
                    ->Start(
                        [this, answer](Frame frame) {
                          std::lock_guard<std::mutex> lock(mu_);
                          frames_.push_back(std::move(frame));
                          cv_.notify_all();
                          return answer;
                        },
                        [this](const absl::Status& cause) {
                          std::lock_guard<std::mutex> lock(mu_);
                          ++failures_;
                          cause_ = absl::Status(cause.code(), cause.message());
                          cv_.notify_all();
                        })
                    .ok());
  }
  bool WaitFailure() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30),
                        [&] { return failures_ > 0; });
  }
  bool WaitFrames(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30),
                        [&] { return frames_.size() >= n; });
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Frame> frames_;
  int failures_ = 0;
  absl::Status cause_;
  std::unique_ptr<LoopbackCommunicator> raw_;
  std::unique_ptr<WireLink> link_;
};

TEST_F(WireLinkTest, StampsEpochAndConsecutiveSequenceNumbers) {
  std::vector<std::string> got;
  std::mutex mu;
  std::condition_variable cv;
  ASSERT_TRUE(raw_->Start(
                      [&](absl::string_view f) {
                        std::lock_guard<std::mutex> lock(mu);
                        got.emplace_back(f);
                        cv.notify_all();
                      },
                      [](const absl::Status&) {})
                  .ok());
  Start();
  ASSERT_TRUE(link_->Send(Hello{.sender_time_ns = 1, .member_index = 2}).ok());
  ASSERT_TRUE(link_->Send(Bye{"x"}).ok());
  ASSERT_TRUE(link_->Send(TaskBatch{}).ok());
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30),
                          [&] { return got.size() == 3; }));
  for (uint64_t i = 0; i < 3; ++i) {
    absl::StatusOr<FrameHeader> h = DecodeFrameHeader(got[i]);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(h->epoch, 5u);
    EXPECT_EQ(h->seq, i + 1);
  }
  EXPECT_EQ(link_->stats().frames_sent, 3);
}

TEST_F(WireLinkTest, DeliversCheckedFramesInOrder) {
  Start();
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    ASSERT_TRUE(raw_->Send(EncodeFrame(5, seq, Heartbeat{
                                                   .sender_time_ns =
                                                       static_cast<int64_t>(
                                                           seq)}))
                    .ok());
  }
  ASSERT_TRUE(WaitFrames(3));
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(std::get<Heartbeat>(frames_[i].body).sender_time_ns,
              static_cast<int64_t>(i + 1));
  }
  EXPECT_EQ(failures_, 0);
}

TEST_F(WireLinkTest, ProtocolErrorsAbortTheLinkAndStopDelivery) {
  Start();
  ASSERT_TRUE(raw_->Send(EncodeFrame(5, 1, Bye{"ok"})).ok());
  ASSERT_TRUE(raw_->Send(EncodeFrame(5, 3, Bye{"skipped 2"})).ok());
  // The link may be down already; if not, this frame must not be delivered.
  (void)raw_->Send(EncodeFrame(5, 4, Bye{"after"}));
  ASSERT_TRUE(WaitFailure());
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(frames_.size(), 1u);
  EXPECT_EQ(cause_.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(cause_.message().find("sequence number 3, expected 2"),
            std::string::npos)
      << cause_;
  EXPECT_NE(cause_.message().find("from b"), std::string::npos) << cause_;
  EXPECT_EQ(failures_, 1);
  EXPECT_EQ(link_->stats().protocol_errors, 1);
  EXPECT_EQ(link_->Send(Bye{}).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(WireLinkTest, WrongEpochIsAProtocolError) {
  Start();
  ASSERT_TRUE(raw_->Send(EncodeFrame(6, 1, Bye{})).ok());
  ASSERT_TRUE(WaitFailure());
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_TRUE(frames_.empty());
  EXPECT_NE(cause_.message().find("epoch 6; this link is epoch 5"),
            std::string::npos)
      << cause_;
}

TEST_F(WireLinkTest, UnknownVersionIsAProtocolError) {
  Start();
  std::string frame = EncodeFrame(5, 1, Bye{});
  frame[0] = 9;
  ASSERT_TRUE(raw_->Send(frame).ok());
  ASSERT_TRUE(WaitFailure());
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_TRUE(frames_.empty());
  EXPECT_NE(cause_.message().find("version 9"), std::string::npos) << cause_;
}

TEST_F(WireLinkTest, AFrameTheHandlerRefusesIsAProtocolError) {
  Start(absl::InvalidArgumentError("not now"));
  ASSERT_TRUE(raw_->Send(EncodeFrame(5, 1, Bye{})).ok());
  (void)raw_->Send(EncodeFrame(5, 2, Bye{}));  // Never delivered.
  ASSERT_TRUE(WaitFailure());
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(frames_.size(), 1u);
  EXPECT_NE(cause_.message().find("not now"), std::string::npos) << cause_;
}

TEST_F(WireLinkTest, OversizedFrameIsRefusedWithoutUsingASequenceNumber) {
  Start();
  Bye huge{std::string(comm::kMaxFrameBytes, 'x')};
  EXPECT_EQ(link_->Send(huge).code(), absl::StatusCode::kInvalidArgument);
  std::string got;
  std::mutex mu;
  std::condition_variable cv;
  ASSERT_TRUE(raw_->Start(
                      [&](absl::string_view f) {
                        std::lock_guard<std::mutex> lock(mu);
                        got = std::string(f);
                        cv.notify_all();
                      },
                      [](const absl::Status&) {})
                  .ok());
  ASSERT_TRUE(link_->Send(Bye{"small"}).ok());
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30),
                          [&] { return !got.empty(); }));
  EXPECT_EQ(DecodeFrameHeader(got)->seq, 1u);
}

TEST_F(WireLinkTest, AbortStopsDeliveryAndFailsOnce) {
  Start();
  link_->Abort(absl::UnavailableError("member declared dead"));
  link_->Abort(absl::InternalError("again"));
  ASSERT_TRUE(WaitFailure());
  (void)raw_->Send(EncodeFrame(5, 1, Bye{}));
  link_.reset();  // Joins: nothing more can arrive.
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_TRUE(frames_.empty());
  EXPECT_EQ(failures_, 1);
  EXPECT_EQ(cause_.code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace hicache::group
