#include "client/cpp/endpoint.h"

#include <stdlib.h>

#include "gtest/gtest.h"

namespace hicache::client {
namespace {

class EndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* old = getenv("XDG_RUNTIME_DIR");
    had_ = old != nullptr;
    if (had_) saved_ = old;
  }
  void TearDown() override {
    if (had_) {
      setenv("XDG_RUNTIME_DIR", saved_.c_str(), 1);
    } else {
      unsetenv("XDG_RUNTIME_DIR");
    }
  }
  bool had_ = false;
  std::string saved_;
};

TEST_F(EndpointTest, UsesXdgRuntimeDir) {
  setenv("XDG_RUNTIME_DIR", "/run/user/1000", 1);
  EXPECT_EQ(DefaultSocketPath(), "/run/user/1000/hicached.sock");
}

TEST_F(EndpointTest, FallsBackToTmp) {
  unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(DefaultSocketPath(), "/tmp/hicached.sock");
  setenv("XDG_RUNTIME_DIR", "", 1);
  EXPECT_EQ(DefaultSocketPath(), "/tmp/hicached.sock");
}

TEST_F(EndpointTest, UnixTarget) {
  EXPECT_EQ(UnixTarget("/tmp/a.sock"), "unix:/tmp/a.sock");
}

}  // namespace
}  // namespace hicache::client
