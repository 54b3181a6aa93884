// CacheCollector over a real engine and session manager: every value is
// read at scrape time from what they count.
#include "daemon/metrics/cache_collector.h"

#include <unistd.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/core/build_info.h"
#include "daemon/metrics/label_values.h"
#include "gtest/gtest.h"
#include "tests/metrics/engine_rig.h"
#include "tests/testing/temp_dir.h"
#include "daemon/pool/persistent_host_segment.h"

namespace hicache::metrics {
namespace {

using Labels = std::map<std::string, std::string>;

class CacheCollectorTest : public ::testing::Test {
 protected:
  // Every sample of the last scrape: (name, labels) -> value.
  void Scrape(size_t max_namespaces = CacheCollector::kDefaultMaxNamespaces,
              testing::EngineRig* rig = nullptr) {
    if (rig == nullptr) rig = &rig_;
    CacheCollector collector(&rig->engine(), &rig->sessions(), max_namespaces);
    samples_.clear();
    types_.clear();
    for (const prometheus::MetricFamily& family : collector.Collect()) {
      EXPECT_TRUE(types_.emplace(family.name, family.type).second)
          << "family twice: " << family.name;
      EXPECT_EQ(family.name.rfind("hicache_", 0), 0u) << family.name;
      EXPECT_FALSE(family.help.empty()) << family.name;
      if (family.type == prometheus::MetricType::Counter) {
        EXPECT_TRUE(family.name.size() > 6 &&
                    family.name.substr(family.name.size() - 6) == "_total")
            << family.name;
      }
      for (const prometheus::ClientMetric& metric : family.metric) {
        Labels labels;
        for (const auto& label : metric.label) labels[label.name] = label.value;
        const double v = family.type == prometheus::MetricType::Counter
                             ? metric.counter.value
                             : metric.gauge.value;
        EXPECT_TRUE(samples_.emplace(std::pair{family.name, labels}, v).second)
            << "duplicate series of " << family.name;
      }
    }
  }
  double Value(const std::string& name, const Labels& labels = {}) {
    auto it = samples_.find({name, labels});
    if (it == samples_.end()) {
      ADD_FAILURE() << "no sample " << name;
      return -1;
    }
    return it->second;
  }
  std::set<std::string> Namespaces() {
    std::set<std::string> out;
    for (const auto& [key, value] : samples_) {
      if (key.first == "hicache_namespace_nodes") {
        out.insert(key.second.at("tenant"));
      }
    }
    return out;
  }

  testing::EngineRig rig_;
  std::map<std::pair<std::string, Labels>, double> samples_;
  std::map<std::string, prometheus::MetricType> types_;
};

TEST_F(CacheCollectorTest, AnIdleDaemonReportsItsGeometryAndZeros) {
  Scrape();
  EXPECT_EQ(Value("hicache_build_info",
                  {{"version", GetBuildInfo().version},
                   {"revision", GetBuildInfo().git_revision},
                   {"backend", "cpu"}}),
            1);
  EXPECT_EQ(Value("hicache_hit_tokens_total", {{"tier", "device"}}), 0);
  EXPECT_EQ(Value("hicache_hit_tokens_total", {{"tier", "miss"}}), 0);
  for (const char* lane : {"0", "1"}) {
    EXPECT_EQ(Value("hicache_device_pages", {{"lane", lane}, {"state", "free"}}),
              15);
    EXPECT_EQ(Value("hicache_device_pages", {{"lane", lane}, {"state", "used"}}),
              0);
    EXPECT_EQ(Value("hicache_host_pages", {{"rank", lane}, {"state", "free"}}),
              32);
  }
  EXPECT_EQ(Value("hicache_page_tokens"), 4);
  EXPECT_EQ(Value("hicache_sessions", {{"role", "scheduler"}}), 0);
  EXPECT_TRUE(Namespaces().empty());
  EXPECT_EQ(types_["hicache_tree_tokens"], prometheus::MetricType::Gauge);
  // No hot-restart series without a state_dir.
  EXPECT_FALSE(types_.contains("hicache_journal_ok"));
}

// Hot restart: the recovery figures and the journal's state.
TEST_F(CacheCollectorTest, HotRestartReportsRecoveryAndTheJournal) {
  ::hicache::testing::TempDir dir;
  const std::string prefix = absl::StrCat("/hicache-metricstest", getpid());
  {
    testing::EngineRig first(nullptr, dir.path(), prefix);
    first.Cache("", testing::Tokens(0, 8));
    first.Cache("", testing::Tokens(100, 8));
    Scrape(CacheCollector::kDefaultMaxNamespaces, &first);
    EXPECT_EQ(Value("hicache_journal_ok"), 1);
    EXPECT_EQ(Value("hicache_journal_puts_refused_total"), 0);
    EXPECT_EQ(types_["hicache_journal_puts_refused_total"],
              prometheus::MetricType::Counter);
    EXPECT_EQ(types_["hicache_journal_backlog_events"],
              prometheus::MetricType::Gauge);
    EXPECT_EQ(types_["hicache_journal_not_durable_records"],
              prometheus::MetricType::Gauge);
    EXPECT_EQ(Value("hicache_host_tier_recovered", {{"unit", "nodes"}}), 0);
  }
  {
    testing::EngineRig second(nullptr, dir.path(), prefix);
    Scrape(CacheCollector::kDefaultMaxNamespaces, &second);
    EXPECT_EQ(Value("hicache_host_tier_recovered", {{"unit", "nodes"}}), 2);
    EXPECT_EQ(Value("hicache_host_tier_recovered", {{"unit", "pages"}}), 4);
    EXPECT_EQ(Value("hicache_host_tier_recovery_dropped",
                    {{"reason", "checksum"}}),
              0);
    EXPECT_EQ(Value("hicache_journal_live_records"), 2);
    EXPECT_GT(Value("hicache_journal_file_bytes"), 0);
    EXPECT_GE(Value("hicache_host_tier_recovery_seconds"), 0);
  }
  RemovePersistentHostSegments(prefix);
}

TEST_F(CacheCollectorTest, HitsBackupsLoadsPoolsAndNamespacesMove) {
  rig_.Cache("tenant", testing::Tokens(0, 12));
  ASSERT_TRUE(rig_.engine().Match("tenant", testing::Tokens(0, 16)).ok());
  Scrape();
  EXPECT_EQ(Value("hicache_hit_tokens_total", {{"tier", "device"}}), 12);
  EXPECT_EQ(Value("hicache_hit_tokens_total", {{"tier", "miss"}}), 4);
  EXPECT_EQ(Value("hicache_query_tokens_total"), 16);
  EXPECT_EQ(Value("hicache_backups_committed_total"), 1);
  EXPECT_GT(Value("hicache_transfer_bytes_total", {{"direction", "to_host"}}),
            0);
  EXPECT_EQ(Value("hicache_device_pages", {{"lane", "0"}, {"state", "used"}}) +
                Value("hicache_device_pages",
                      {{"lane", "1"}, {"state", "used"}}),
            3);
  EXPECT_EQ(Value("hicache_tree_tokens", {{"tier", "device"}}), 12);
  EXPECT_EQ(Value("hicache_tree_tokens", {{"tier", "host"}}), 12);
  EXPECT_EQ(Value("hicache_namespace_tokens",
                  {{"tenant", "tenant"}, {"tier", "device"}}),
            12);
  EXPECT_EQ(Value("hicache_namespace_nodes", {{"tenant", "tenant"}}), 1);
  EXPECT_EQ(Value("hicache_namespaces"), 1);

  rig_.EvictAndLoad("tenant", testing::Tokens(0, 12));
  Scrape();
  EXPECT_EQ(Value("hicache_hit_tokens_total", {{"tier", "host"}}), 12);
  EXPECT_EQ(Value("hicache_loads_done_total"), 1);
  EXPECT_GE(Value("hicache_evicted_pages_total", {{"tier", "device"}}), 3);
  EXPECT_GT(Value("hicache_transfer_bytes_total", {{"direction", "to_device"}}),
            0);
  EXPECT_EQ(Value("hicache_copy_failures_total"), 0);
}

TEST_F(CacheCollectorTest, SessionsAndStreamsByRoleAndNamespace) {
  auto scheduler = rig_.sessions().Open("s", SessionRole::kScheduler, 0, "a",
                                        absl::Minutes(1));
  ASSERT_TRUE(scheduler.ok());
  auto worker = rig_.sessions().Open("w", SessionRole::kWorker, 1, "a",
                                     absl::Minutes(1));
  ASSERT_TRUE(worker.ok());
  ASSERT_TRUE(rig_.sessions().BeginStream(scheduler->id).ok());
  ASSERT_TRUE(rig_.sessions().BeginStream(scheduler->id).ok());
  ASSERT_TRUE(
      rig_.sessions().Allocate(scheduler->id, {AllocationItem{.num_pages = 2}})
          .ok());
  Scrape();
  EXPECT_EQ(Value("hicache_sessions", {{"role", "scheduler"}}), 1);
  EXPECT_EQ(Value("hicache_sessions", {{"role", "worker"}}), 1);
  EXPECT_EQ(Value("hicache_session_streams", {{"role", "scheduler"}}), 2);
  EXPECT_EQ(Value("hicache_session_streams", {{"role", "worker"}}), 0);
  // A namespace with sessions but nothing cached yet is reported.
  EXPECT_EQ(Value("hicache_namespace_sessions", {{"tenant", "a"}}), 2);
  EXPECT_EQ(Value("hicache_namespace_session_pages", {{"tenant", "a"}}), 2);
  EXPECT_EQ(Value("hicache_namespace_tokens",
                  {{"tenant", "a"}, {"tier", "device"}}),
            0);
  rig_.sessions().EndStream(scheduler->id);
  ASSERT_TRUE(rig_.sessions().Close(scheduler->id).ok());
  Scrape();
  EXPECT_EQ(Value("hicache_sessions", {{"role", "scheduler"}}), 0);
  EXPECT_EQ(Value("hicache_namespace_session_pages", {{"tenant", "a"}}), 0);
}

// Namespace quotas (docs/quotas.md): each namespace with one reports it and
// what it holds against it; refusals count.
TEST_F(CacheCollectorTest, QuotasAndWhatNamespacesHoldAgainstThem) {
  ASSERT_TRUE(rig_.engine()
                  .SetNamespaceQuota({.ns = "a",
                                      .device_limit = 8,
                                      .device_guaranteed = 2})
                  .ok());
  auto a = rig_.sessions().Open("s", SessionRole::kScheduler, 0, "a",
                                absl::Minutes(1));
  ASSERT_TRUE(a.ok());
  auto b = rig_.sessions().Open("s", SessionRole::kScheduler, 0, "b",
                                absl::Minutes(1));
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(
      rig_.sessions().Allocate(a->id, {AllocationItem{.num_pages = 3}}).ok());
  EXPECT_EQ(
      rig_.sessions().Allocate(a->id, {AllocationItem{.num_pages = 6}})
          .status()
          .code(),
      absl::StatusCode::kResourceExhausted);
  Scrape();
  const auto quota = [&](const char* tier, const char* kind) {
    return Value("hicache_namespace_quota_pages",
                 {{"tenant", "a"}, {"tier", tier}, {"kind", kind}});
  };
  EXPECT_EQ(quota("device", "limit"), 8);
  EXPECT_EQ(quota("device", "guaranteed"), 2);
  EXPECT_EQ(quota("host", "limit"), 0);
  EXPECT_EQ(Value("hicache_namespace_quota_used_pages",
                  {{"tenant", "a"}, {"tier", "device"}}),
            3);
  EXPECT_EQ(Value("hicache_quota_refusals_total"), 1);
  // "b" has no quota: no quota series.
  for (const auto& [key, value] : samples_) {
    if (key.first.rfind("hicache_namespace_quota", 0) == 0) {
      EXPECT_EQ(key.second.at("tenant"), "a") << key.first;
    }
  }
}

TEST_F(CacheCollectorTest, ManyNamespacesAreCappedAndSummed) {
  for (int i = 0; i < 8; ++i) {
    auto pages = rig_.engine().Allocate(1);
    ASSERT_TRUE(pages.ok()) << pages.status();
    ASSERT_TRUE(rig_.engine()
                    .Insert(absl::StrCat("ns-", i), testing::Tokens(0, 4),
                            *pages)
                    .ok());
  }
  Scrape(/*max_namespaces=*/3);
  const std::set<std::string> names = Namespaces();
  EXPECT_EQ(names.size(), 4u);
  EXPECT_TRUE(names.count(kOtherNamespace));
  EXPECT_EQ(Value("hicache_namespace_nodes", {{"tenant", kOtherNamespace}}),
            5);
  double device = 0;
  for (const std::string& ns : names) {
    device += Value("hicache_namespace_tokens",
                    {{"tenant", ns}, {"tier", "device"}});
  }
  EXPECT_EQ(device, Value("hicache_tree_tokens", {{"tier", "device"}}));
  EXPECT_EQ(Value("hicache_namespaces"), 8);
}

TEST_F(CacheCollectorTest, TheTreeWalkRunsAtMostOncePerInterval) {
  auto insert = [&](const std::string& ns) {
    auto pages = rig_.engine().Allocate(1);
    ASSERT_TRUE(pages.ok()) << pages.status();
    ASSERT_TRUE(rig_.engine().Insert(ns, testing::Tokens(0, 4), *pages).ok());
  };
  auto namespaces = [](const CacheCollector& collector) {
    std::set<std::string> out;
    for (const prometheus::MetricFamily& family : collector.Collect()) {
      if (family.name != "hicache_namespace_nodes") continue;
      for (const auto& metric : family.metric) {
        out.insert(metric.label.at(0).value);
      }
    }
    return out;
  };
  CacheCollector slow(&rig_.engine(), &rig_.sessions(), 20, absl::Hours(1));
  CacheCollector fast(&rig_.engine(), &rig_.sessions(), 20,
                      absl::ZeroDuration());
  insert("first");
  EXPECT_EQ(namespaces(slow), std::set<std::string>{"first"});
  insert("second");
  // Scraping in a loop reuses the last walk...
  EXPECT_EQ(namespaces(slow), std::set<std::string>{"first"});
  // ...while the other series stay current.
  Scrape();
  EXPECT_EQ(Value("hicache_namespaces"), 2);
  EXPECT_EQ(namespaces(fast), (std::set<std::string>{"first", "second"}));
}

}  // namespace
}  // namespace hicache::metrics
