#include "client/ctl/cli.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/endpoint.h"
#include "client/cpp/hicache_session.h"
#include "client/ctl/shm_command.h"
#include "daemon/main/daemon_server.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.pb.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "version/version.h"

namespace hicache::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct CliResult {
  int code = 0;
  std::string out;
  std::string err;
};

using Json = nlohmann::json;

// `text` must be exactly one JSON document (and a newline).
Json ParseOneDocument(const std::string& text) {
  EXPECT_FALSE(text.empty());
  if (text.empty()) return Json();
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.find('\n'), text.size() - 1) << "more than one line: " << text;
  Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(doc.is_discarded()) << text;
  return doc;
}

CliResult Cli(std::vector<std::string> args) {
  std::ostringstream out, err;
  const int code = RunCli(args, out, err);
  return {code, out.str(), err.str()};
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DaemonConfig config;
    config.cp_size = 4;
    // Written against write_through_selective (an unbacked eviction
    // removes the node); the default is write_ahead.
    config.write_policy = WritePolicy::kWriteThroughSelective;
    config.served_ranks = {0, 2};
    auto server = DaemonServer::Start(config, socket_, Clock::Real());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("d.sock");
  std::unique_ptr<DaemonServer> server_;
};

TEST_F(CliTest, HealthPrintsServing) {
  CliResult r = Cli({"--socket=" + socket_, "health"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "SERVING\n");
  r = Cli({"--socket", socket_, "health", "hicache.v1.HiCache"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_EQ(r.out, "SERVING\n");
}

TEST_F(CliTest, HealthOfUnknownServiceFails) {
  CliResult r = Cli({"--socket=" + socket_, "health", "nope.Service"});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_EQ(r.out, "SERVICE_UNKNOWN\n");
}

TEST_F(CliTest, HealthJson) {
  CliResult r = Cli({"--json", "--socket=" + socket_, "health"});
  EXPECT_EQ(r.code, kExitOk);
  const Json doc = ParseOneDocument(r.out);
  EXPECT_EQ(doc["status"], "SERVING");
  EXPECT_EQ(doc["target"], "unix:" + socket_);
}

// Issue 14: health's JSON was concatenated by hand, so a quote broke it.
TEST_F(CliTest, HealthJsonEscapesTheServiceName) {
  const std::string service = "evil\"},{\"status\":\"SERVING\\";
  CliResult r = Cli({"--json", "--socket=" + socket_, "health", service});
  EXPECT_EQ(r.code, kExitFailure);
  const Json doc = ParseOneDocument(r.out);
  EXPECT_EQ(doc["status"], "SERVICE_UNKNOWN");
  EXPECT_EQ(doc["service"], service);
}

// Issue 14: flags after the command were ignored or misparsed ("tree --json"
// failed, "health --json" asked for a service named "--json").
TEST_F(CliTest, GlobalFlagsAfterTheCommand) {
  CliResult r = Cli({"health", "--json", "--socket=" + socket_});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(ParseOneDocument(r.out)["status"], "SERVING");
  r = Cli({"health", "--socket", socket_, "--timeout", "2", "--json"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(ParseOneDocument(r.out)["service"], "");
  r = Cli({"tree", "--json", "--socket=" + socket_});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_TRUE(ParseOneDocument(r.out)["nodes"].is_array());
  r = Cli({"--json", "stats", "--socket=" + socket_});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  ParseOneDocument(r.out);
  // Mixed: one before, one after.
  r = Cli({"--socket=" + socket_, "cache-stats", "--json"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_TRUE(ParseOneDocument(r.out)["lanes"].is_array());
}

TEST_F(CliTest, StatsHumanAndJson) {
  CliResult r = Cli({"--socket=" + socket_, "stats"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("cp size:       4 (ranks served: 0,2)"));
  EXPECT_THAT(r.out, HasSubstr("lane  device free"));  // Then the cache.
  EXPECT_THAT(r.out, Not(HasSubstr("CP group")));  // Standalone.

  r = Cli({"--socket=" + socket_, "--json", "stats"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  // One JSON document: the daemon and the cache.
  const Json doc = ParseOneDocument(r.out);
  v1::GetStatsResponse stats;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(doc["daemon"].dump(), &stats)
          .ok())
      << r.out;
  v1::CacheStats cache;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(doc["cache"].dump(), &cache)
          .ok());
  EXPECT_EQ(cache.lanes_size(), 4);
  EXPECT_EQ(stats.geometry().cp_size(), 4u);
  EXPECT_EQ(stats.geometry().served_ranks_size(), 2);
  EXPECT_EQ(stats.pid(), getpid());
  // 64-bit counters that fit are numbers, not strings.
  EXPECT_TRUE(doc["daemon"]["pid"].is_string());  // int64: proto3 JSON.
  EXPECT_TRUE(doc["cache"]["nodes"].is_string());
  EXPECT_FALSE(doc["daemon"].contains("cp_group"));  // Standalone.
}

TEST_F(CliTest, TargetOverridesSocket) {
  CliResult r =
      Cli({"--socket=/nonexistent.sock", "--target=unix:" + socket_, "health"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
}

// Cache commands against the daemon, with one cached request (node 2..).
class CacheCliTest : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    stub_ = std::shared_ptr<v1::HiCache::Stub>(
        v1::HiCache::NewStub(grpc::CreateChannel(
            client::UnixTarget(socket_), grpc::InsecureChannelCredentials())));
    std::shared_ptr<v1::HiCache::Stub> stub = stub_;
    session_ =
        *client::Session::Open(stub, "cli-test", v1::ROLE_SCHEDULER, 0, "");
    v1::AllocateItem item;
    item.set_num_pages(2);
    auto pages = *session_->Allocate({item});
    std::vector<int32_t> tokens(100);
    for (int i = 0; i < 100; ++i) tokens[i] = 7000 + i;
    v1::InsertRequest insert;
    insert.add_items()->set_tokens(client::PackTokens(tokens));
    *insert.mutable_items(0)->mutable_pages() = pages.allocations(0).pages();
    node_ = session_->Insert(insert)->results(0).node();
  }
  // Caches tokens first..first+count-1 as one new node; returns its id.
  uint64_t InsertNode(int32_t first, int32_t count) {
    v1::AllocateItem item;
    item.set_num_pages((count + 63) / 64);
    auto pages = session_->Allocate({item});
    EXPECT_TRUE(pages.ok()) << pages.status();
    std::vector<int32_t> tokens(count);
    for (int32_t i = 0; i < count; ++i) tokens[i] = first + i;
    v1::InsertRequest insert;
    insert.add_items()->set_tokens(client::PackTokens(tokens));
    *insert.mutable_items(0)->mutable_pages() = pages->allocations(0).pages();
    auto inserted = session_->Insert(insert);
    EXPECT_TRUE(inserted.ok()) << inserted.status();
    return inserted->results(0).node();
  }
  // Counts a hit on the node holding first..first+count-1.
  void Hit(int32_t first, int32_t count) {
    std::vector<int32_t> tokens(count);
    for (int32_t i = 0; i < count; ++i) tokens[i] = first + i;
    auto matched = session_->MatchPrefix({tokens});
    ASSERT_TRUE(matched.ok()) << matched.status();
  }
  std::vector<uint64_t> TreeIds(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"--socket=" + socket_, "--json", "tree"};
    args.insert(args.end(), extra.begin(), extra.end());
    CliResult r = Cli(args);
    EXPECT_EQ(r.code, kExitOk) << r.err;
    std::vector<uint64_t> ids;
    const Json doc = ParseOneDocument(r.out);
    for (const Json& n : doc["nodes"]) {
      ids.push_back(std::stoull(n["id"].get<std::string>()));
    }
    return ids;
  }

  std::shared_ptr<v1::HiCache::Stub> Stub() const { return stub_; }

  std::shared_ptr<v1::HiCache::Stub> stub_;
  std::unique_ptr<client::Session> session_;
  uint64_t node_ = 0;
};

TEST_F(CacheCliTest, Tree) {
  CliResult r = Cli({"--socket=" + socket_, "tree"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out,
              HasSubstr(absl::StrCat("#", node_, " [7000,7001,7002,7003..")));
  EXPECT_THAT(r.out, HasSubstr("len=100 device lock=0"));
  EXPECT_THAT(r.out, HasSubstr("owners=0,1"));  // One page in lane 0, one in 1.
  r = Cli({"--socket=" + socket_, "--json", "tree", "--sort", "hits", "--limit",
           "5"});
  EXPECT_EQ(r.code, kExitOk);
  // A JSON number: it fits a double exactly.
  EXPECT_EQ(ParseOneDocument(r.out)["nodes"][0]["length"], "100");
  r = Cli({"--socket=" + socket_, "tree", "--prefix", "1,2,3"});
  EXPECT_EQ(r.out, "(empty)\n");
  EXPECT_EQ(Cli({"--socket=" + socket_, "tree", "--sort", "size"}).code,
            kExitUsage);
}

TEST_F(CacheCliTest, Node) {
  CliResult r = Cli({"--socket=" + socket_, "node", std::to_string(node_)});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("tokens   0..100 (100)"));
  EXPECT_THAT(r.out, HasSubstr("page 0   owner"));
  EXPECT_EQ(Cli({"--socket=" + socket_, "node", "999999"}).code, kExitFailure);
  EXPECT_EQ(Cli({"--socket=" + socket_, "node"}).code, kExitUsage);
}

TEST_F(CacheCliTest, Match) {
  std::vector<std::string> tokens;
  for (int i = 0; i < 64; ++i) tokens.push_back(std::to_string(7000 + i));
  CliResult r =
      Cli({"--socket=" + socket_, "match", absl::StrJoin(tokens, ",")});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("device    64 tokens in 1 pages"));
  // A peek: the node's hit count is untouched.
  EXPECT_THAT(Cli({"--socket=" + socket_, "tree"}).out, HasSubstr("hits=0"));
  const std::string file = dir_.Child("tokens.txt");
  std::ofstream(file) << "7000 7001 7002\n";
  r = Cli({"--socket=" + socket_, "match", "--file", file});
  EXPECT_THAT(r.out, HasSubstr("miss      3 tokens"));  // Floors to a page.
  EXPECT_EQ(Cli({"--socket=" + socket_, "match", "x,y"}).code, kExitUsage);
}

TEST_F(CacheCliTest, Tiers) {
  std::vector<std::string> tokens;
  for (int i = 0; i < 64; ++i) tokens.push_back(std::to_string(7000 + i));
  CliResult r =
      Cli({"--socket=" + socket_, "tiers", absl::StrJoin(tokens, ",")});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "0\tdevice 64\thost 0\tmiss 0\n");
  // A pure lookup: the node's hit count is untouched.
  EXPECT_THAT(Cli({"--socket=" + socket_, "tree"}).out, HasSubstr("hits=0"));
  const std::string file = dir_.Child("sequences.txt");
  std::ofstream(file) << absl::StrJoin(tokens, " ") << "\n\n1,2,3\n";
  r = Cli({"--socket=" + socket_, "--json", "tiers", "--file", file, "--ns",
           ""});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  const Json doc = ParseOneDocument(r.out);
  ASSERT_EQ(doc["hits"].size(), 2u);
  EXPECT_EQ(doc["hits"][0]["device_tokens"], "64");
  EXPECT_EQ(Cli({"--socket=" + socket_, "tiers", "x,y"}).code, kExitUsage);
  // Another namespace holds nothing of it.
  r = Cli({"--socket=" + socket_, "tiers", "--ns", "other",
           absl::StrJoin(tokens, ",")});
  EXPECT_EQ(r.out, "0\tdevice 0\thost 0\tmiss 64\n");
}

TEST_F(CacheCliTest, CacheStatsAndSessions) {
  CliResult r = Cli({"--socket=" + socket_, "cache-stats"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("tree       1 nodes; device 100 tokens"));
  EXPECT_THAT(r.out, HasSubstr("lane  device free"));
  r = Cli({"--socket=" + socket_, "sessions"});
  EXPECT_THAT(r.out, HasSubstr("cli-test"));
  EXPECT_THAT(r.out, HasSubstr("scheduler"));
  r = Cli({"--socket=" + socket_, "--json", "sessions"});
  EXPECT_THAT(r.out, HasSubstr("\"client_name\":\"cli-test\""));
}

TEST_F(CacheCliTest, EvictPinUnpinFreeRoom) {
  CliResult r =
      Cli({"--socket=" + socket_, "evict", "--device", "10,10,10,10"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("evicted 2 device pages"));
  EXPECT_EQ(Cli({"--socket=" + socket_, "evict"}).code, kExitUsage);
  EXPECT_EQ(Cli({"--socket=" + socket_, "evict", "--device", "-1"}).code,
            kExitUsage);
  // The node was unbacked: eviction removed it, so pinning it fails.
  r = Cli({"--socket=" + socket_, "pin", std::to_string(node_), "--ttl-ms",
           "1000"});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_EQ(Cli({"--socket=" + socket_, "pin", "5"}).code, kExitUsage);
  EXPECT_EQ(Cli({"--socket=" + socket_, "unpin", "x"}).code, kExitUsage);
  r = Cli({"--socket=" + socket_, "free-room", "--l1", "4", "--l2", "8"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("L1 4 pages per lane, L2 8 pages per rank"));
  EXPECT_EQ(Cli({"--socket=" + socket_, "free-room", "--l1", "-3"}).code,
            kExitUsage);
}

TEST_F(CacheCliTest, PinAndUnpinALiveNode) {
  CliResult r = Cli({"--socket=" + socket_, "pin", std::to_string(node_),
                     "--ttl-ms", "60000"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(Cli({"--socket=" + socket_, "tree"}).out, HasSubstr(" pin="));
  r = Cli({"--socket=" + socket_, "unpin", std::to_string(node_)});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(Cli({"--socket=" + socket_, "tree"}).out,
              Not(HasSubstr(" pin=")));
}

// Until `watch` returns, a probe session is opened and closed again and
// again: whenever the watch's stream subscribes, its next two events are a
// close and an open, in some order (no guess at when it subscribes).
class SessionProber {
 public:
  explicit SessionProber(std::shared_ptr<v1::HiCache::Stub> stub)
      : thread_([this, stub] {
          while (!done_.load()) {
            auto probe = client::Session::Open(stub, "probe",
                                               v1::ROLE_SCHEDULER, 0, "");
            if (probe.ok()) (void)(*probe)->Close();
            absl::SleepFor(absl::Milliseconds(20));  // Pacing only.
          }
        }) {}
  ~SessionProber() {
    done_.store(true);
    thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

TEST_F(CacheCliTest, WatchPrintsLiveEvents) {
  CliResult r;
  {
    SessionProber prober(Stub());
    r = Cli({"--socket=" + socket_, "watch", "--count", "2"});
  }
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("session_closed"));
}

// A given --timeout ends a watch (it blocked for good: 'watch --timeout 2'
// ran for more than 10 minutes); quiet or not, the end is exit 0. Nothing
// is timed: the test only needs the call to return.
TEST_F(CacheCliTest, WatchEndsAtItsTimeout) {
  CliResult r = Cli({"--socket=" + socket_, "watch", "--timeout", "0.5"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  r = Cli({"--socket=" + socket_, "--timeout=0.5", "watch", "--json"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
}

// Issue 14: "tree --sort hits --limit 5" sorted only the first 5 nodes. The
// daemon now sorts every matching node, then cuts the page.
TEST_F(CacheCliTest, TreeSortsBeforeItLimits) {
  const uint64_t a = InsertNode(100000, 64);   // Recently used.
  const uint64_t b = InsertNode(200000, 192);  // Longest.
  const uint64_t c = InsertNode(300000, 128);  // Most hits.
  for (int i = 0; i < 3; ++i) Hit(300000, 128);
  absl::SleepFor(absl::Milliseconds(5));
  Hit(100000, 64);
  EXPECT_EQ(TreeIds({"--sort", "tokens", "--limit", "1"}),
            std::vector<uint64_t>{b});
  EXPECT_EQ(TreeIds({"--sort", "hits", "--limit", "1"}),
            std::vector<uint64_t>{c});
  EXPECT_EQ(TreeIds({"--sort", "recency", "--limit", "1"}),
            std::vector<uint64_t>{a});
  EXPECT_EQ(TreeIds({"--sort", "id", "--limit", "2"}),
            (std::vector<uint64_t>{node_, a}));
  EXPECT_EQ(TreeIds({"--sort", "hits", "--limit", "2"}),
            (std::vector<uint64_t>{c, a}));
  // Sorted listings are flat (no tree indentation) and still readable.
  CliResult r = Cli({"--socket=" + socket_, "tree", "--sort", "hits"});
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("#", c, " [300000,")));
  EXPECT_THAT(r.out, HasSubstr("hits=3"));
}

TEST_F(CacheCliTest, TreePagesThroughContinuationTokens) {
  const std::vector<uint64_t> added = {
      InsertNode(100000, 64), InsertNode(200000, 64), InsertNode(300000, 64)};
  std::vector<uint64_t> expected = {node_};
  expected.insert(expected.end(), added.begin(), added.end());
  // Page by page, by hand.
  std::vector<uint64_t> seen;
  std::string token;
  for (int page = 0; page < 10; ++page) {
    std::vector<std::string> args = {"--socket=" + socket_,
                                     "--json",
                                     "tree",
                                     "--sort",
                                     "id",
                                     "--limit",
                                     "1"};
    if (!token.empty()) args.push_back("--page_token=" + token);
    CliResult r = Cli(args);
    ASSERT_EQ(r.code, kExitOk) << r.err;
    const Json doc = ParseOneDocument(r.out);
    EXPECT_EQ(doc["total_nodes"], "4");
    ASSERT_EQ(doc["nodes"].size(), 1u);
    seen.push_back(std::stoull(doc["nodes"][0]["id"].get<std::string>()));
    token = doc["next_page_token"].get<std::string>();
    if (token.empty()) break;
  }
  EXPECT_EQ(seen, expected);
  // --all follows the tokens; still one document.
  EXPECT_EQ(TreeIds({"--sort", "id", "--limit", "1", "--all"}), expected);
  EXPECT_EQ(TreeIds({"--all", "--limit", "3"}).size(), 4u);  // Tree order.
  // The human listing says how to go on.
  CliResult r = Cli({"--socket=" + socket_, "tree", "--limit", "2"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out,
              HasSubstr("(2 of 4 nodes shown; next page: --page_token="));
}

TEST_F(CacheCliTest, TreeRejectsForeignAndGarbageTokens) {
  InsertNode(100000, 64);
  CliResult r = Cli({"--socket=" + socket_, "tree", "--page_token", "garbage"});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT: page_token"));
  // A token of a hits listing cannot continue an id listing.
  r = Cli({"--socket=" + socket_, "--json", "tree", "--sort", "hits", "--limit",
           "1"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const std::string token =
      ParseOneDocument(r.out)["next_page_token"].get<std::string>();
  ASSERT_FALSE(token.empty());
  r = Cli(
      {"--socket=" + socket_, "tree", "--sort", "id", "--page_token", token});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr("another query"));
  r = Cli({"--socket=" + socket_, "tree", "--sort", "hits", "--ns", "x",
           "--page_token", token});
  EXPECT_EQ(r.code, kExitFailure);
  r = Cli(
      {"--socket=" + socket_, "tree", "--sort", "hits", "--page_token", token});
  EXPECT_EQ(r.code, kExitOk) << r.err;
}

// Issue 14: "free-room" without arguments reset both targets to 0. It now
// reads them (CacheStats, a pure read) and changes nothing.
TEST_F(CacheCliTest, FreeRoomWithoutArgumentsShowsTheTargets) {
  CliResult r = Cli({"--socket=" + socket_, "free-room"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out,
            "free-room targets: L1 0 pages per lane, L2 0 pages per "
            "rank\n");
  r = Cli({"--socket=" + socket_, "free-room", "--l1", "4", "--l2", "8"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  r = Cli({"--socket=" + socket_, "--json", "cache-stats"});
  const Json stats = ParseOneDocument(r.out);
  EXPECT_EQ(stats["l1_free_room_pages"], "4");
  EXPECT_EQ(stats["l2_free_room_pages"], "8");
  EXPECT_EQ(stats["free_room_reported"], true);
  EXPECT_EQ(r.code, kExitOk) << r.err;
  for (int i = 0; i < 2; ++i) {  // Reading twice changes nothing.
    r = Cli({"--socket=" + socket_, "free-room"});
    EXPECT_EQ(r.code, kExitOk) << r.err;
    EXPECT_THAT(r.out, HasSubstr("L1 4 pages per lane, L2 8 pages per rank"));
  }
  // One target given: the other keeps its value.
  r = Cli({"--socket=" + socket_, "free-room", "--l2", "5", "--json"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  const Json doc = ParseOneDocument(r.out);
  EXPECT_EQ(doc["l1_pages_per_lane"], "4");
  EXPECT_EQ(doc["l2_pages_per_rank"], "5");
  r = Cli({"--socket=" + socket_, "free-room", "--l1", "0"});
  EXPECT_THAT(r.out, HasSubstr("L1 0 pages per lane, L2 5 pages per rank"));
  // The daemon's range check is an RPC error that names its code.
  r = Cli({"--socket=" + socket_, "free-room", "--l1", "999999999"});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT: free-room targets"));
  EXPECT_THAT(Cli({"--socket=" + socket_, "free-room"}).out,
              HasSubstr("L1 0 pages per lane, L2 5 pages per rank"));
}

TEST_F(CacheCliTest, RpcErrorsNameTheirCode) {
  CliResult r = Cli({"--socket=" + socket_, "node", "999999"});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr("hicachectl: NOT_FOUND: "));
  EXPECT_THAT(r.err, HasSubstr("hicachectl tree"));
}

TEST_F(CacheCliTest, WatchJsonIsOneObjectPerLine) {
  CliResult r;
  {
    SessionProber prober(Stub());
    r = Cli({"--socket=" + socket_, "watch", "--count", "2", "--json"});
  }
  EXPECT_EQ(r.code, kExitOk) << r.err;
  std::vector<std::string> kinds;
  for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
    kinds.push_back(ParseOneDocument(absl::StrCat(line, "\n"))["kind"]);
  }
  EXPECT_THAT(kinds, ::testing::UnorderedElementsAre("session_opened",
                                                     "session_closed"));
}

TEST(CliUsageTest, HelpExitsZeroAndDocumentsExitCodes) {
  for (const char* flag : {"--help", "-h", "help"}) {
    CliResult r = Cli({flag});
    EXPECT_EQ(r.code, kExitOk);
    EXPECT_THAT(r.out, HasSubstr("Exit codes:"));
    EXPECT_THAT(r.out, HasSubstr("Examples:"));
    EXPECT_THAT(r.out, HasSubstr("health"));
    EXPECT_THAT(r.out, HasSubstr("stats"));
  }
}

TEST(CliUsageTest, UsageErrorsExitTwo) {
  EXPECT_EQ(Cli({}).code, kExitUsage);
  CliResult r = Cli({"frobnicate"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("unknown command 'frobnicate'"));
  // The first unknown word is named, not the last ('completion bash' said
  // "unknown command 'bash'").
  r = Cli({"completion", "bash"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("unknown command 'completion'"));
  r = Cli({"stats", "one", "two"});
  EXPECT_THAT(r.err, HasSubstr("unexpected argument 'one' for stats"));
  r = Cli({"--colour", "stats"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("unknown option '--colour'"));
  r = Cli({"stats", "--colour"});  // After the command too.
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("unknown option '--colour'"));
  r = Cli({"tree", "--layers"});  // Another command's option.
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("'--layers'"));
  EXPECT_EQ(Cli({"stats", "extra"}).code, kExitUsage);
  EXPECT_EQ(Cli({"health", "a", "b"}).code, kExitUsage);
  EXPECT_EQ(Cli({"--socket"}).code, kExitUsage);
  EXPECT_EQ(Cli({"health", "--socket"}).code, kExitUsage);
  EXPECT_EQ(Cli({"node"}).code, kExitUsage);
  EXPECT_EQ(Cli({"pin", "5"}).code, kExitUsage);  // --ttl-ms is required.
  EXPECT_EQ(Cli({"unpin", "x"}).code, kExitUsage);
  // Bad values name their option.
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--timeout=-1", "health"}, "--timeout"},
      {{"health", "--timeout", "soon"}, "--timeout"},
      {{"health", "--timeout", "1e300"}, "--timeout"},
      {{"tree", "--limit", "abc"}, "--limit"},
      {{"tree", "--limit", "0"}, "--limit"},
      {{"tree", "--limit", "10001"}, "--limit"},
      {{"tree", "--depth", "-2"}, "--depth"},
      {{"tree", "--sort", "size"}, "--sort"},
      {{"evict", "--device", "1,x"}, "--device"},
      {{"evict", "--device", "-1"}, "--device"},
      {{"pin", "5", "--ttl-ms", "0"}, "--ttl-ms"},
      {{"pin", "5", "--ttl-ms", "4294967296"}, "--ttl-ms"},
      {{"free-room", "--l1", "-3"}, "--l1"},
      {{"watch", "--count", "0"}, "--count"},
      {{"node", "0"}, "id"},
  };
  for (const auto& [args, flag] : bad) {
    r = Cli(args);
    EXPECT_EQ(r.code, kExitUsage) << absl::StrJoin(args, " ");
    EXPECT_THAT(r.err, HasSubstr(flag)) << absl::StrJoin(args, " ");
  }
}

TEST(CliUsageTest, VersionOnEveryCommand) {
  const std::string expected =
      absl::StrCat("hicachectl ", hicache::VersionString(), "\n");
  CliResult r = Cli({"--version"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_EQ(r.out, expected);
  for (const char* command :
       {"health", "stats", "tree", "node", "match", "tiers", "cache-stats",
        "sessions",
        "evict", "pin", "unpin", "free-room", "watch"}) {
    // Even where required arguments are missing: nothing is contacted.
    r = Cli({command, "--version"});
    EXPECT_EQ(r.code, kExitOk) << command << ": " << r.err;
    EXPECT_EQ(r.out, expected) << command;
  }
}

TEST(CliUsageTest, CommandHelp) {
  CliResult r = Cli({"tree", "--help"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_THAT(r.out, HasSubstr("--page_token"));
  EXPECT_THAT(r.out, HasSubstr("--all"));
  r = Cli({"help", "free-room"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_THAT(r.out, HasSubstr("--l1"));
  EXPECT_EQ(Cli({"help", "nope"}).code, kExitUsage);
}

TEST(CliUsageTest, TcpTargetsUseTlsUnlessTold) {
  // TLS by default: a refused TCP connection is an RPC error, exit 1.
  CliResult r = Cli({"--target=127.0.0.1:1", "--timeout=0.5", "health"});
  EXPECT_EQ(r.code, kExitFailure);
  // UNAVAILABLE, or DEADLINE_EXCEEDED when gRPC's retries of the read
  // outlast --timeout: either way the target and the TLS options are named.
  EXPECT_THAT(
      r.err, ::testing::AnyOf(HasSubstr("UNAVAILABLE: cannot reach a daemon at "
                                        "127.0.0.1:1"),
                              HasSubstr("DEADLINE_EXCEEDED: no answer from "
                                        "127.0.0.1:1")));
  EXPECT_THAT(r.err, HasSubstr("--tls_"));
  // Contradictions and unreadable files are command-line errors.
  r = Cli({"--target=127.0.0.1:1", "--tls_cert_file=/etc/hostname", "health"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--tls_key_file"));
  r = Cli({"--target=127.0.0.1:1", "--insecure_tcp_for_testing",
           "--tls_ca_file=/etc/hostname", "health"});
  EXPECT_EQ(r.code, kExitUsage);
  r = Cli({"--target=127.0.0.1:1", "--tls_ca_file=/nonexistent.pem", "health"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err,
              HasSubstr("--tls_ca_file: cannot read '/nonexistent.pem'"));
  r = Cli({"--socket=/tmp/x.sock", "--tls_ca_file=/etc/hostname", "health"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("TCP targets only"));
}

TEST(CliUsageTest, UnreachableDaemonExitsOneWithAdvice) {
  testing::TempDir dir;
  const std::string socket = dir.Child("none.sock");
  CliResult r = Cli({"--timeout=0.5", "--socket=" + socket, "health"});
  EXPECT_EQ(r.code, kExitFailure);
  // UNAVAILABLE, or DEADLINE_EXCEEDED when gRPC's retries of the read
  // outlast --timeout: the message is the same.
  EXPECT_THAT(r.err, HasSubstr("no daemon at " + socket + " (no such socket)"));
  EXPECT_THAT(r.err, HasSubstr("is hicached running? check --socket"));
  r = Cli({"--timeout=3", "--socket=" + socket, "health"});
  EXPECT_EQ(r.code, kExitFailure);  // Retries end before the deadline.
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE: no daemon at " + socket +
                               " (no such socket)"));
  r = Cli({"--timeout=0.5", "--socket=" + socket, "tree", "--json"});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_EQ(r.out, "");  // No half document on errors.
}

// hicachectl over the daemon's TCP TLS listener: server verified against
// --tls_ca_file, client certificate for mTLS, operator role by the
// certificate's common name (--operator_cert_names).
TEST(CliTlsTest, MutualTlsAgainstTheDaemonsTcpListener) {
  testing::TempDir dir;
  const std::string d = dir.path();
  const std::string script = absl::StrCat(
      "set -e; cd ", d, "; ",
      "O=/usr/bin/openssl; K='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
      "-nodes'; ",
      "$O req -x509 $K -keyout ca.key -out ca.pem -subj /CN=test-ca -days 1; ",
      "$O req $K -keyout server.key -out server.csr -subj /CN=localhost; ",
      "printf 'subjectAltName=DNS:localhost\\n' > san.ext; ",
      "$O x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
      "-out server.pem -days 1 -extfile san.ext; ",
      "for cn in ctl-operator someone; do "
      "$O req $K -keyout $cn.key -out $cn.csr -subj /CN=$cn; "
      "$O x509 -req -in $cn.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
      "-out $cn.pem -days 1; done");
  auto made = testing::Run({"/bin/sh", "-c", script});
  if (!made.ok() || made->exit_code != 0) {
    GTEST_SKIP() << "openssl could not make certificates here: "
                 << (made.ok() ? made->err : made.status().ToString());
  }
  DaemonConfig config;
  config.listen_tcp = "127.0.0.1:0";
  config.tls_cert_file = d + "/server.pem";
  config.tls_key_file = d + "/server.key";
  config.tls_client_ca_file = d + "/ca.pem";
  config.operator_cert_names = {"ctl-operator"};
  auto server = DaemonServer::Start(config, dir.Child("d.sock"), Clock::Real());
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string target = absl::StrCat("127.0.0.1:", (*server)->tcp_port());
  auto as = [&](const std::string& cn, std::vector<std::string> args) {
    std::vector<std::string> argv = {
        "--target=" + target, "--tls_ca_file=" + d + "/ca.pem",
        "--tls_server_name=localhost", "--timeout=5"};
    if (!cn.empty()) {
      argv.push_back("--tls_cert_file=" + d + "/" + cn + ".pem");
      argv.push_back("--tls_key_file=" + d + "/" + cn + ".key");
    }
    argv.insert(argv.end(), args.begin(), args.end());
    return Cli(argv);
  };
  CliResult r = as("ctl-operator", {"health"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "SERVING\n");
  r = as("ctl-operator", {"tree", "--json"});  // An operator RPC.
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(ParseOneDocument(r.out)["total_nodes"], "0");
  r = as("someone", {"tree"});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(r.err, HasSubstr("docs/security.md"));
  // Without a client certificate the daemon (which asks for one) refuses
  // the handshake; without the CA the daemon's certificate is not trusted.
  r = as("", {"--timeout=2", "health"});
  EXPECT_EQ(r.code, kExitFailure);
  r = Cli({"--target=" + target, "--timeout=2",
           "--tls_cert_file=" + d + "/ctl-operator.pem",
           "--tls_key_file=" + d + "/ctl-operator.key", "health"});
  EXPECT_EQ(r.code, kExitFailure);
}

}  // namespace
}  // namespace hicache::ctl

namespace hicache::ctl {
namespace {

// hicachectl shm, on a directory standing in for /dev/shm: a live instance
// (this test holds its lock, as a running daemon does), a stopped one (lock
// file, nobody holding it), an orphaned one (segments only), a kept host
// tier, and files that are not hicached's. clean removes exactly the
// segments of the instances nobody holds, and never a live one's.
class ShmCommandTest : public ::testing::Test {
 protected:
  void Touch(const std::string& name, const std::string& text = "") {
    std::ofstream(dir_.Child(name)) << text;
  }
  bool Exists(const std::string& name) {
    return access(dir_.Child(name).c_str(), F_OK) == 0;
  }
  CliResult Shm(std::vector<std::string> args) {
    args.insert(args.begin(), "shm");
    args.push_back("--shm_dir=" + dir_.path());
    return Cli(args);
  }
  testing::TempDir dir_;
};

TEST_F(ShmCommandTest, ListsAndCleansWhatNoDaemonHolds) {
  Touch("hicache-node-1-device-r0", std::string(4096, 'x'));
  Touch("hicache-node-1-host-r1-g0123456789abcdef");
  Touch("hicache-node-1.lock", "123\n");
  Touch("hicache-gone-host-r0");
  Touch("hicache-gone-host-r1-gfedcba9876543210");
  Touch("hicache-gone.lock", "456\n");
  Touch("hicache-old-device-r3");
  Touch("hicache-old-device-rx");     // Not a segment name.
  Touch("hicache-9lives-device-r0");  // Not an instance id.
  Touch("unrelated");
  const int lock = open(dir_.Child("hicache-node-1.lock").c_str(), O_RDONLY);
  ASSERT_GE(lock, 0);
  ASSERT_EQ(flock(lock, LOCK_EX), 0);

  CliResult r = Shm({"list"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("gone stopped (pid 456): 2 segments"));
  EXPECT_THAT(r.out, HasSubstr("node-1 live (pid 123): 2 segments, 4096 bytes"));
  EXPECT_THAT(r.out, HasSubstr("old orphaned: 1 segments"));
  EXPECT_THAT(r.out, Not(HasSubstr("9lives")));
  r = Cli({"--json", "shm", "list", "--shm_dir=" + dir_.path()});
  const Json doc = ParseOneDocument(r.out);
  ASSERT_EQ(doc["instances"].size(), 3u) << r.out;
  EXPECT_EQ(doc["instances"][1]["instance"], "node-1");
  EXPECT_EQ(doc["instances"][1]["state"], "live");
  EXPECT_EQ(doc["instances"][1]["bytes"], 4096);

  // A dry run removes nothing.
  r = Shm({"clean", "--dry_run"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("would remove hicache-gone-host-r0"));
  EXPECT_TRUE(Exists("hicache-gone-host-r0"));
  // One instance only.
  r = Shm({"clean", "--instance=old"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_FALSE(Exists("hicache-old-device-r3"));
  EXPECT_TRUE(Exists("hicache-gone-host-r0"));
  EXPECT_FALSE(Exists("hicache-old.lock"));  // Its lock taken, then removed.
  r = Shm({"clean", "--instance=nobody"});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr("no instance 'nobody'"));
  r = Shm({"clean", "--instance=../etc"});
  EXPECT_EQ(r.code, kExitUsage);
  // Everything not live.
  r = Shm({"clean"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("node-1: live (pid 123), left alone"));
  EXPECT_THAT(r.out, HasSubstr("removed 2 segments"));
  EXPECT_FALSE(Exists("hicache-gone-host-r0"));
  EXPECT_FALSE(Exists("hicache-gone-host-r1-gfedcba9876543210"));
  EXPECT_FALSE(Exists("hicache-gone.lock"));
  EXPECT_TRUE(Exists("hicache-node-1-device-r0"));
  EXPECT_TRUE(Exists("hicache-node-1-host-r1-g0123456789abcdef"));
  EXPECT_TRUE(Exists("hicache-node-1.lock"));
  EXPECT_TRUE(Exists("hicache-old-device-rx"));
  EXPECT_TRUE(Exists("hicache-9lives-device-r0"));
  EXPECT_TRUE(Exists("unrelated"));
  close(lock);
  // The daemon is gone now: its instance is stopped and goes too.
  r = Shm({"clean"});
  EXPECT_THAT(r.out, HasSubstr("node-1: stopped, removed"));
  EXPECT_FALSE(Exists("hicache-node-1-device-r0"));
  r = Shm({"list"});
  EXPECT_THAT(r.out, HasSubstr("no hicached shared memory in"));
}

TEST(ShmNamesTest, InstanceOfSegment) {
  EXPECT_EQ(InstanceOfSegment("hicache-a-device-r0"), "a");
  EXPECT_EQ(InstanceOfSegment("hicache-node-7-host-r12"), "node-7");
  EXPECT_EQ(InstanceOfSegment("hicache-n-host-r1-g0123456789abcdef"), "n");
  EXPECT_EQ(InstanceOfSegment("hicache-n-host-r1-g0123"), "");
  EXPECT_EQ(InstanceOfSegment("hicache-a-device-r"), "");
  EXPECT_EQ(InstanceOfSegment("hicache-a-Device-r0"), "");
  EXPECT_EQ(InstanceOfSegment("hicache-1a-device-r0"), "");
  EXPECT_EQ(InstanceOfSegment("hicache-a.lock"), "");
  EXPECT_EQ(InstanceOfSegment("other-a-device-r0"), "");
}

}  // namespace
}  // namespace hicache::ctl

namespace hicache::ctl {
namespace {

// `hicachectl cache-stats` shows the storage tier when there is one.
TEST(StorageCliTest, CacheStatsShowsTheStorageTier) {
  testing::TempDir dir;
  const std::string socket = dir.Child("d.sock");
  DaemonConfig config;
  config.cp_size = 2;
  config.storage.dir = dir.Child("l3");
  config.storage.pages_per_rank = 64;
  auto server = DaemonServer::Start(config, socket, Clock::Real());
  ASSERT_TRUE(server.ok()) << server.status();
  CliResult r = Cli({"--socket=" + socket, "cache-stats"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("storage    0 of 128 pages"));
  EXPECT_THAT(r.out, HasSubstr("rank1.data, 64 pages"));
  r = Cli({"--socket=" + socket, "--json", "cache-stats"});
  EXPECT_THAT(r.out, HasSubstr("\"capacity_pages\":\"128\""));
}

}  // namespace
}  // namespace hicache::ctl
