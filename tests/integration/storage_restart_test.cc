// The storage tier across a crash (issue 28, "Restart"): a C = 2 hicached
// with --l3_dir and the default policies (no --state_dir: the host tier
// dies with it) stores committed prefixes; it is SIGKILLed, and a new
// daemon on the same directory serves them from the storage tier: every
// prefix is a storage hit, loads back through the host tier and is
// byte-exact on both ranks. A daemon of another KV layout on that
// directory starts with an empty storage tier (never another model's
// bytes), and a second daemon on a directory in use is refused. Nothing
// waits on timing but WaitStored, which waits (a condition, with a
// generous deadline) for the writer to settle.
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/integration/hot_restart_fixture.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/subprocess.h"

namespace hicache::hot_restart {
namespace {

constexpr int kPrefixes = 6;
constexpr int kPages = 6;

class StorageRestartTest : public HotRestartTest {
 protected:
  std::vector<std::string> StorageFlags(const std::string& preset = "tiny") {
    std::vector<std::string> flags = WithFlag(Flags(2), "--state_dir", "");
    flags = WithFlag(flags, "--kv_preset", preset);
    flags.push_back("--l3_dir=" + dir_.Child("l3"));
    flags.push_back("--l3_pages=1024");
    // The cost model weighs measured read times: off, this test checks
    // bytes (storage_tier_test covers the model).
    flags.push_back("--l3_recompute_ns_per_token=0");
    return flags;
  }
  // Waits until every page handed to the storage tier's writer is written.
  void WaitStored(int64_t pages) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (true) {
      const v1::CacheStats s = Stats();
      const v1::StorageTierStats& st = s.storage();
      ASSERT_EQ(st.write_errors(), 0);
      ASSERT_EQ(st.pages_dropped(), 0);
      if (st.pages_written() >= pages &&
          st.pages_written() == st.pages_queued()) {
        return;
      }
      ASSERT_LT(absl::Now(), deadline) << s.storage().DebugString();
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  static std::vector<int32_t> Prefix(int i) {
    return Tokens(1000 * (i + 1), kPages);
  }
};

TEST_F(StorageRestartTest, StoredPrefixesSurviveSigkillByteExact) {
  ASSERT_NO_FATAL_FAILURE(Start(StorageFlags()));
  const v1::CacheStats fresh = Stats();
  ASSERT_TRUE(fresh.storage().enabled());
  ASSERT_EQ(fresh.storage().stores_size(), 2);  // One per rank.
  for (int i = 0; i < kPrefixes; ++i) {
    ASSERT_NE(Request(Prefix(i)), 0u) << i;
  }
  ASSERT_NO_FATAL_FAILURE(WaitStored(kPrefixes * kPages));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGKILL, 128 + SIGKILL));

  ASSERT_NO_FATAL_FAILURE(Start(StorageFlags()));
  const v1::CacheStats after = Stats();
  EXPECT_EQ(after.nodes(), 0);  // The tree starts empty.
  EXPECT_GE(after.storage().used_pages(), kPrefixes * kPages);
  for (int i = 0; i < kPrefixes; ++i) {
    SCOPED_TRACE(absl::StrCat("prefix ", i));
    const std::vector<int32_t> tokens = Prefix(i);
    const std::optional<v1::MatchResult> match = PeekMatch(tokens);
    ASSERT_TRUE(match.has_value());
    EXPECT_EQ(match->host_hit_tokens(), 0);
    EXPECT_EQ(match->storage_hit_tokens(), static_cast<int64_t>(tokens.size()));
    ASSERT_NO_FATAL_FAILURE(LoadAndVerify(tokens));
    // InspectNode marks the storage tier's copy of the loaded node.
    const std::optional<v1::MatchResult> now = PeekMatch(tokens);
    ASSERT_TRUE(now.has_value());
    v1::NodeInfo info;
    ASSERT_NO_FATAL_FAILURE(Inspect(now->last_device_node(), &info));
    EXPECT_EQ(info.storage_pages(), kPages);
  }
  const v1::CacheStats loaded = Stats();
  EXPECT_EQ(loaded.storage().promoted_pages(), kPrefixes * kPages);
  EXPECT_EQ(loaded.storage().checksum_failures(), 0);
  EXPECT_EQ(loaded.storage().read_failures(), 0);

  // A second daemon on the same directory is refused.
  {
    std::vector<std::string> argv = {testing::DaemonPath()};
    for (std::string flag : StorageFlags()) {
      if (absl::StartsWith(flag, "--socket=")) {
        flag = "--socket=" + dir_.Child("other.sock");
      }
      if (absl::StartsWith(flag, "--instance=")) flag += "-other";
      argv.push_back(flag);
    }
    auto second = testing::Subprocess::Start(argv);
    ASSERT_TRUE(second.ok()) << second.status();
    auto code = second->Wait(absl::Seconds(30));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_NE(*code, 0);
    EXPECT_TRUE(
        absl::StrContains(second->Stderr(), "is in use by another process"))
        << second->Stderr();
  }

  // Another KV layout on the same directory: an empty storage tier.
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
  ASSERT_NO_FATAL_FAILURE(Start(StorageFlags("tiny-draft")));
  EXPECT_EQ(Stats().storage().used_pages(), 0);
  const std::optional<v1::MatchResult> other = PeekMatch(Prefix(0));
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(other->storage_hit_tokens(), 0);
}

// The shared tier (issue 28, "Shared tier"): daemon A, C = 2, with
// --l3_redis on a private redis-server stores prefixes and stops; daemon B,
// another instance with an empty tree and host tier, started on the same
// store, finds each prefix there and loads it byte-exact on both ranks.
TEST_F(StorageRestartTest, ASharedStoreServesAnotherDaemonsPrefixes) {
  auto redis = testing::RedisServer::Start();
  ASSERT_TRUE(redis.ok()) << redis.status();
  auto flags = [&](const std::string& instance) {
    std::vector<std::string> f = WithFlag(Flags(2), "--state_dir", "");
    f = WithFlag(f, "--instance", instance);
    f.push_back("--l3_redis=" + (*redis)->address());
    f.push_back("--l3_recompute_ns_per_token=0");
    return f;
  };
  ASSERT_NO_FATAL_FAILURE(Start(flags(instance_)));
  ASSERT_EQ(Stats().storage().stores_size(), 1);  // Shared by both ranks.
  for (int i = 0; i < kPrefixes; ++i) ASSERT_NE(Request(Prefix(i)), 0u) << i;
  ASSERT_NO_FATAL_FAILURE(WaitStored(kPrefixes * kPages));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));

  ASSERT_NO_FATAL_FAILURE(Start(flags(instance_ + "-b")));
  EXPECT_EQ(Stats().nodes(), 0);
  for (int i = 0; i < kPrefixes; ++i) {
    SCOPED_TRACE(absl::StrCat("prefix ", i));
    const std::vector<int32_t> tokens = Prefix(i);
    const std::optional<v1::MatchResult> match = PeekMatch(tokens);
    ASSERT_TRUE(match.has_value());
    EXPECT_EQ(match->storage_hit_tokens(), static_cast<int64_t>(tokens.size()));
    ASSERT_NO_FATAL_FAILURE(LoadAndVerify(tokens));
  }
  const v1::CacheStats loaded = Stats();
  EXPECT_EQ(loaded.storage().promoted_pages(), kPrefixes * kPages);
  EXPECT_EQ(loaded.storage().checksum_failures(), 0);
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
}

}  // namespace
}  // namespace hicache::hot_restart
