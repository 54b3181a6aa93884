// A Gloo link between two processes: this test (rank 0, the leader side) and
// gloo_link_peer (rank 1), which echoes every frame. The peer's death is a
// real one (SIGKILL: the kernel closes its sockets).

#include <signal.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/comm/gloo_communicator.h"
#include "gloo/rendezvous/file_store.h"
#include "gtest/gtest.h"
#include "tests/comm/link_probe.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace hicache::comm {
namespace {

using testing::LinkProbe;
using testing::NumberedFrame;

class GlooTwoProcessTest : public ::testing::Test {
 protected:
  // Starts the peer and connects to it.
  void SetUp() override {
    auto peer = hicache::testing::Subprocess::Start(
        {hicache::testing::RunfilePath("tests/comm/gloo_link_peer"),
         dir_.path(), "two-process", "60000"});
    ASSERT_TRUE(peer.ok()) << peer.status();
    peer_.emplace(*std::move(peer));
    auto device = GlooCommunicator::CreateTcpDevice("127.0.0.1");
    ASSERT_TRUE(device.ok()) << device.status();
    GlooLinkOptions o;
    o.store = &store_;
    o.key_prefix = "two-process";
    o.rank = 0;
    o.device = *device;
    o.receive_timeout = absl::Seconds(60);  // Death must show before this.
    o.peer_name = "peer process";
    auto link = GlooCommunicator::Connect(o);
    ASSERT_TRUE(link.ok()) << link.status() << "\npeer: " << peer_->Stderr();
    link_ = *std::move(link);
    ASSERT_TRUE(probe_.StartOn(*link_).ok());
  }

  // Sends frames and checks that they come back whole and in order.
  void Echo(const std::vector<std::string>& frames) {
    const size_t before = probe_.frame_count();
    for (const auto& f : frames) ASSERT_TRUE(link_->Send(f).ok());
    ASSERT_TRUE(probe_.WaitFrames(before + frames.size()))
        << "peer: " << peer_->Stderr();
    const auto got = probe_.frames();
    for (size_t i = 0; i < frames.size(); ++i) {
      ASSERT_TRUE(got[before + i] == frames[i]) << i;
    }
  }

  hicache::testing::TempDir dir_;
  gloo::rendezvous::FileStore store_{dir_.path()};
  std::optional<hicache::testing::Subprocess> peer_;
  LinkProbe probe_;  // Outlives link_.
  std::unique_ptr<GlooCommunicator> link_;
};

std::vector<std::string> SomeFrames() {
  std::vector<std::string> frames;
  for (int i = 0; i < 200; ++i) frames.push_back(NumberedFrame("f", i, i * 13));
  frames.push_back(std::string(size_t{1} << 20, 'M'));
  frames.push_back("");
  return frames;
}

TEST_F(GlooTwoProcessTest, EchoesThenPeerSeesTheCloseAfterBye) {
  Echo(SomeFrames());
  Echo({"bye"});
  link_.reset();  // The peer's link fails (UNAVAILABLE) after its "bye".
  auto code = peer_->Wait(absl::Seconds(20));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << peer_->Stderr();
  EXPECT_NE(peer_->Stderr().find("UNAVAILABLE"), std::string::npos)
      << peer_->Stderr();
}

TEST_F(GlooTwoProcessTest, KilledPeerFailsTheLinkWithUnavailable) {
  Echo(SomeFrames());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(peer_->Signal(SIGKILL).ok());
  const auto cause = probe_.WaitFailure(std::chrono::seconds(20));
  ASSERT_TRUE(cause.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(cause->code(), absl::StatusCode::kUnavailable) << *cause;
  EXPECT_NE(cause->message().find("peer process"), std::string::npos)
      << *cause;
  EXPECT_EQ(link_->Send("x").code(), absl::StatusCode::kFailedPrecondition);
  link_.reset();
  EXPECT_EQ(probe_.failures(), 1);
  EXPECT_TRUE(probe_.violations().empty());
}

TEST_F(GlooTwoProcessTest, AbortHereFailsThePeer) {
  Echo({"one", "two"});
  link_->Abort(absl::AbortedError("leader leaving"));
  auto code = peer_->Wait(absl::Seconds(20));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 3) << peer_->Stderr();
  EXPECT_NE(peer_->Stderr().find("UNAVAILABLE"), std::string::npos)
      << peer_->Stderr();
}

}  // namespace
}  // namespace hicache::comm
