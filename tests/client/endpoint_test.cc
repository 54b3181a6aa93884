#include "client/cpp/endpoint.h"

#include <stdlib.h>

#include <set>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

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

// The service config is JSON naming exactly the retried reads, each retried
// on UNAVAILABLE only, and never a call that changes the daemon's state.
TEST(ServiceConfigTest, RetriesOnlyTheReads) {
  const nlohmann::json config = nlohmann::json::parse(ServiceConfigJson());
  ASSERT_EQ(config["methodConfig"].size(), 1u);
  const nlohmann::json& method = config["methodConfig"][0];
  std::set<std::string> names;
  for (const auto& name : method["name"]) {
    names.insert(name["service"].get<std::string>() + "/" +
                 name["method"].get<std::string>());
  }
  EXPECT_EQ(names.size(), RetriedReadMethods().size());
  for (const char* read :
       {"grpc.health.v1.Health/Check", "hicache.v1.HiCache/GetStats",
        "hicache.v1.HiCache/Stats", "hicache.v1.HiCache/GetLayout",
        "hicache.v1.HiCache/KeepAlive", "hicache.v1.HiCache/DumpTree",
        "hicache.v1.HiCache/InspectNode", "hicache.v1.HiCache/ListSessions"}) {
    EXPECT_TRUE(names.contains(read)) << read;
  }
  for (const char* mutating :
       {"Allocate", "Free", "Insert", "Admit", "Complete", "Lock", "Unlock",
        "MatchPrefix", "OpenSession", "CloseSession", "Evict", "Pin",
        "SetFreeRoom", "FinishLoad", "RegisterFence", "ReleaseFence"}) {
    EXPECT_FALSE(names.contains(std::string("hicache.v1.HiCache/") + mutating))
        << mutating;
  }
  EXPECT_EQ(method["waitForReady"], true);
  const nlohmann::json& retry = method["retryPolicy"];
  EXPECT_EQ(retry["maxAttempts"], kReadMaxAttempts);
  EXPECT_EQ(retry["retryableStatusCodes"], nlohmann::json({"UNAVAILABLE"}));
  EXPECT_EQ(nlohmann::json::parse(
                ServiceConfigJson(false))["methodConfig"][0]["waitForReady"],
            false);
}

}  // namespace
}  // namespace hicache::client
