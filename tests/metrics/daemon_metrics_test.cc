// DaemonMetrics: a real HTTP endpoint (civetweb) scraped over a plain
// socket; binding errors come back as a Status, never as an exception.
#include "daemon/metrics/daemon_metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/time/clock.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/metrics/engine_rig.h"

namespace hicache::metrics {
namespace {

using ::testing::HasSubstr;

// GET `path` on 127.0.0.1:`port` over HTTP/1.0; the whole response.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_EQ(write(fd, request.data(), request.size()),
            static_cast<ssize_t>(request.size()));
  std::string response;
  char buffer[65536];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
  close(fd);
  return response;
}

TEST(DaemonMetricsTest, ServesEverySeriesOverHttpOnAPickedPort) {
  auto metrics = DaemonMetrics::Start("127.0.0.1:0", {"/pkg.Svc/Get"});
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const int port = (*metrics)->port();
  ASSERT_GT(port, 0);
  testing::EngineRig rig((*metrics)->engine_observer());
  (*metrics)->Watch(&rig.engine(), &rig.sessions());
  rig.Cache("tenant", testing::Tokens(0, 8));

  const std::string response = HttpGet(port, "/metrics");
  EXPECT_THAT(response, HasSubstr("200 OK"));
  EXPECT_THAT(response, HasSubstr("# TYPE hicache_hit_tokens_total counter"));
  EXPECT_THAT(response, HasSubstr(
                            "hicache_rpcs_in_flight{method=\"Get\","
                            "service=\"pkg.Svc\"} 0"));
  EXPECT_THAT(response,
              HasSubstr("hicache_layer_copy_seconds_count{op=\"backup\"}"));
  EXPECT_THAT(response, HasSubstr("hicache_backups_committed_total 1"));
  EXPECT_THAT(response,
              HasSubstr("hicache_namespace_nodes{tenant=\"tenant\"} 1"));
  EXPECT_THAT(HttpGet(port, "/other"), HasSubstr("404"));

  (*metrics)->StopServing();
  (*metrics)->StopServing();  // Idempotent.
  EXPECT_EQ(HttpGet(port, "/metrics"), "");
}

TEST(DaemonMetricsTest, SilentClientsDoNotBlockScrapesForLong) {
  auto metrics = DaemonMetrics::Start("127.0.0.1:0", {});
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const int port = (*metrics)->port();
  // More idle connections than the server has threads.
  std::vector<int> idle;
  for (int i = 0; i < 3; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    idle.push_back(fd);
  }
  const absl::Time start = absl::Now();
  EXPECT_THAT(HttpGet(port, "/metrics"), HasSubstr("200 OK"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  for (int fd : idle) close(fd);
}

TEST(DaemonMetricsTest, APortInUseIsUnavailableNamingTheAddress) {
  auto first = DaemonMetrics::Start("127.0.0.1:0", {});
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*first)->port());
  auto second = DaemonMetrics::Start(address, {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("cannot serve metrics on ", address)));
}

TEST(DaemonMetricsTest, ABadAddressIsInvalid) {
  for (const char* address : {"", "localhost:9464", "127.0.0.1:99999",
                              "9464", "[::1]:0"}) {
    auto metrics = DaemonMetrics::Start(address, {});
    ASSERT_FALSE(metrics.ok()) << address;
    EXPECT_EQ(metrics.status().code(), absl::StatusCode::kInvalidArgument)
        << address;
  }
}

}  // namespace
}  // namespace hicache::metrics
