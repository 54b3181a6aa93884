// DumpTree paging against a real (in-process) daemon: a tree whose one-shot
// dump would exceed gRPC's 4 MiB message limit comes back in pages, in
// every sort order, without loss or repetition; hostile page tokens are
// INVALID_ARGUMENT (or a harmless page), never a crash; paging a tree that
// changes between pages ends. Then hicachectl pages through it with --all.
#include <algorithm>
#include <set>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/endpoint.h"
#include "client/cpp/hicache_session.h"
#include "client/ctl/cli.h"
#include "daemon/main/daemon_server.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"

namespace hicache {
namespace {

constexpr size_t kGrpcDefaultLimit = size_t{4} << 20;
constexpr int kNodes = 100000;
constexpr int kPageTokens = 4;  // One page per node.

class TreePagingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    socket_ = new std::string(dir_->Child("d.sock"));
    DaemonConfig config;
    config.page_size = kPageTokens;
    config.device_pages_per_rank = kNodes + 20000;
    auto server = DaemonServer::Start(config, *socket_, Clock::Real());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
    stub_ = v1::HiCache::NewStub(
                grpc::CreateChannel(client::UnixTarget(*socket_),
                                    grpc::InsecureChannelCredentials()))
                .release();
    auto shared = std::shared_ptr<v1::HiCache::Stub>(
        v1::HiCache::NewStub(grpc::CreateChannel(
            client::UnixTarget(*socket_), grpc::InsecureChannelCredentials())));
    auto session = client::Session::Open(
        shared, "paging-test", v1::ROLE_SCHEDULER, 0, "", absl::Seconds(600));
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = session->release();
    InsertNodes(0, kNodes);
  }
  static void TearDownTestSuite() {
    delete session_;
    delete stub_;
    delete server_;
    delete socket_;
    delete dir_;
  }

  // Nodes first..first+count-1: node i holds tokens 4i+1..4i+4, a child of
  // the root (first tokens all differ).
  static void InsertNodes(int first, int count) {
    for (int done = 0; done < count;) {
      const int batch = std::min(4096, count - done);
      std::vector<v1::AllocateItem> items(batch);
      for (auto& item : items) item.set_num_pages(1);
      auto pages = session_->Allocate(items);
      ASSERT_TRUE(pages.ok()) << pages.status();
      v1::InsertRequest insert;
      for (int k = 0; k < batch; ++k) {
        const int i = first + done + k;
        std::vector<int32_t> tokens(kPageTokens);
        for (int t = 0; t < kPageTokens; ++t) tokens[t] = 4 * i + t + 1;
        v1::InsertItem* item = insert.add_items();
        item->set_tokens(client::PackTokens(tokens));
        *item->mutable_pages() = pages->allocations(k).pages();
      }
      auto inserted = session_->Insert(insert);
      ASSERT_TRUE(inserted.ok()) << inserted.status();
      done += batch;
    }
  }

  static grpc::Status Dump(const v1::DumpTreeRequest& request,
                           v1::DumpTreeResponse* response) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(60));
    return stub_->DumpTree(&ctx, request, response);
  }

  static testing::TempDir* dir_;
  static std::string* socket_;
  static DaemonServer* server_;
  static v1::HiCache::Stub* stub_;
  static client::Session* session_;
};

testing::TempDir* TreePagingTest::dir_ = nullptr;
std::string* TreePagingTest::socket_ = nullptr;
DaemonServer* TreePagingTest::server_ = nullptr;
v1::HiCache::Stub* TreePagingTest::stub_ = nullptr;
client::Session* TreePagingTest::session_ = nullptr;

// A request as clients before paging sent it (no limit: "every node") gets
// one bounded page and a token, not a 4 MiB+ message.
TEST_F(TreePagingTest, RequestWithoutLimitGetsTheDefaultPage) {
  v1::DumpTreeRequest request;
  request.set_all_namespaces(true);
  v1::DumpTreeResponse response;
  ASSERT_TRUE(Dump(request, &response).ok());
  EXPECT_EQ(response.nodes_size(), 1000);
  EXPECT_EQ(response.total_nodes(), kNodes);
  EXPECT_FALSE(response.next_page_token().empty());
  EXPECT_LT(response.ByteSizeLong(), kGrpcDefaultLimit);
}

// Every order pages through all 100k nodes, each exactly once, each page
// under the limit, although the whole tree would not fit in one message.
TEST_F(TreePagingTest, EveryOrderPagesThroughTheWholeTree) {
  for (v1::TreeSort sort :
       {v1::TREE_SORT_UNSPECIFIED, v1::TREE_SORT_HITS, v1::TREE_SORT_RECENCY,
        v1::TREE_SORT_TOKENS, v1::TREE_SORT_ID}) {
    SCOPED_TRACE(v1::TreeSort_Name(sort));
    v1::DumpTreeRequest request;
    request.set_all_namespaces(true);
    request.set_sort(sort);
    request.set_limit(10000);
    std::set<uint64_t> ids;
    std::vector<uint64_t> order;
    size_t total_bytes = 0;
    int pages = 0;
    for (;;) {
      v1::DumpTreeResponse response;
      const grpc::Status status = Dump(request, &response);
      ASSERT_TRUE(status.ok()) << status.error_message();
      ASSERT_LT(response.ByteSizeLong(), kGrpcDefaultLimit);
      total_bytes += response.ByteSizeLong();
      ++pages;
      ASSERT_LE(pages, 20);
      for (const v1::NodeInfo& n : response.nodes()) {
        EXPECT_TRUE(ids.insert(n.id()).second) << "node " << n.id() << " twice";
        order.push_back(n.id());
      }
      if (response.next_page_token().empty()) break;
      request.set_page_token(response.next_page_token());
    }
    EXPECT_EQ(ids.size(), static_cast<size_t>(kNodes));
    EXPECT_GT(total_bytes, kGrpcDefaultLimit);  // One message would not do.
    if (sort == v1::TREE_SORT_ID) {
      EXPECT_TRUE(std::is_sorted(order.begin(), order.end()));
    }
  }
}

// The continuation token's bytes, pinned: computed with the hand-written
// encoder that preceded le_bytes. Web-safe base64 of "HCT1", the sort (0),
// the filter's fingerprint, then the position: the next index (100) and an
// id (0), each a little-endian u64.
TEST_F(TreePagingTest, TokenBytesArePinned) {
  v1::DumpTreeRequest request;
  request.set_all_namespaces(true);
  request.set_limit(100);
  v1::DumpTreeResponse response;
  ASSERT_TRUE(Dump(request, &response).ok());
  EXPECT_EQ(response.next_page_token(),
            "SENUMQCUb3WKx6egRmQAAAAAAAAAAAAAAAAAAAA");
  request.set_page_token(response.next_page_token());
  v1::DumpTreeResponse second;
  ASSERT_TRUE(Dump(request, &second).ok());
  EXPECT_EQ(second.nodes_size(), 100);
}

TEST_F(TreePagingTest, HostileTokensAreRefusedOrHarmless) {
  v1::DumpTreeRequest request;
  request.set_all_namespaces(true);
  request.set_sort(v1::TREE_SORT_HITS);
  request.set_limit(100);
  v1::DumpTreeResponse first;
  ASSERT_TRUE(Dump(request, &first).ok());
  std::string raw;
  ASSERT_TRUE(absl::WebSafeBase64Unescape(first.next_page_token(), &raw));
  // Not tokens at all.
  for (const std::string& token :
       {std::string("garbage"), std::string("!!!!"), std::string(5000, 'A'),
        absl::WebSafeBase64Escape(std::string(29, '\0')),
        absl::WebSafeBase64Escape(raw.substr(0, 20)),
        absl::WebSafeBase64Escape(raw + "x"), first.next_page_token() + "*"}) {
    request.set_page_token(token);
    v1::DumpTreeResponse response;
    const grpc::Status status = Dump(request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << token.substr(0, 60);
  }
  // Every byte of a real token altered: refused, or a page that pages on to
  // the end (a forged position is only a starting point).
  for (v1::TreeSort sort : {v1::TREE_SORT_HITS, v1::TREE_SORT_UNSPECIFIED}) {
    request.set_sort(sort);
    request.clear_page_token();
    ASSERT_TRUE(Dump(request, &first).ok());
    ASSERT_TRUE(absl::WebSafeBase64Unescape(first.next_page_token(), &raw));
    for (size_t i = 0; i < raw.size(); ++i) {
      for (unsigned char value : {0x00, 0xff}) {  // Each: a 100k dump.
        std::string forged = raw;
        forged[i] = static_cast<char>(value);
        request.set_page_token(absl::WebSafeBase64Escape(forged));
        request.set_limit(50000);
        v1::DumpTreeResponse response;
        const grpc::Status status = Dump(request, &response);
        if (status.ok()) {
          EXPECT_LE(response.nodes_size(), 10000);
          EXPECT_LT(response.ByteSizeLong(), kGrpcDefaultLimit);
        } else {
          EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
        }
      }
    }
  }
  request.clear_page_token();
  request.set_limit(-1);  // As "unlimited" before paging: the default page.
  v1::DumpTreeResponse response;
  ASSERT_TRUE(Dump(request, &response).ok());
  EXPECT_EQ(response.nodes_size(), 1000);
  request.set_limit(10);
  request.set_sort(static_cast<v1::TreeSort>(77));
  EXPECT_EQ(Dump(request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// The tree grows and shrinks between pages: paging never fails or loops.
TEST_F(TreePagingTest, PagingAChangingTreeEnds) {
  int next = kNodes + 1000000;
  for (v1::TreeSort sort : {v1::TREE_SORT_UNSPECIFIED, v1::TREE_SORT_ID,
                            v1::TREE_SORT_HITS, v1::TREE_SORT_RECENCY}) {
    SCOPED_TRACE(v1::TreeSort_Name(sort));
    v1::DumpTreeRequest request;
    request.set_all_namespaces(true);
    request.set_sort(sort);
    request.set_limit(10000);
    int pages = 0;
    for (;; ++pages) {
      ASSERT_LT(pages, 200) << "paging does not end";
      v1::DumpTreeResponse response;
      const grpc::Status status = Dump(request, &response);
      ASSERT_TRUE(status.ok()) << status.error_message();
      if (response.next_page_token().empty()) break;
      request.set_page_token(response.next_page_token());
      // New nodes, and matches that change hits and recency.
      InsertNodes(next, 200);
      next += 200;
      std::vector<std::vector<int32_t>> queries;
      for (int i = 0; i < 50; ++i) {
        const int node = (pages * 997 + i * 131) % kNodes;
        queries.push_back(
            {4 * node + 1, 4 * node + 2, 4 * node + 3, 4 * node + 4});
      }
      ASSERT_TRUE(session_->MatchPrefix(queries).ok());
      grpc::ClientContext ctx;
      v1::EvictRequest evict;
      evict.add_device_pages_per_lane(150);
      v1::EvictResponse evicted;
      ASSERT_TRUE(stub_->Evict(&ctx, evict, &evicted).ok());
    }
  }
}

// hicachectl follows the tokens: one JSON document with every node.
TEST_F(TreePagingTest, HicachectlAllFollowsTheTokens) {
  v1::DumpTreeRequest count_request;
  count_request.set_all_namespaces(true);
  count_request.set_limit(1);
  v1::DumpTreeResponse count;
  ASSERT_TRUE(Dump(count_request, &count).ok());
  std::ostringstream out, err;
  // A generous per-call deadline: a 10,000-node page took more than the
  // default 5 s under TSan on a busy machine (the test is about the tokens,
  // not the time).
  const int code = ctl::RunCli({"--socket=" + *socket_, "--timeout=600", "tree",
                                "--all", "--json", "--sort", "id", "--limit",
                                "10000"},
                               out, err);
  ASSERT_EQ(code, ctl::kExitOk) << err.str();
  const std::string text = out.str();
  EXPECT_EQ(text.find('\n'), text.size() - 1);
  const nlohmann::json doc = nlohmann::json::parse(text);
  EXPECT_EQ(doc["nodes"].size(), static_cast<size_t>(count.total_nodes()));
  EXPECT_EQ(doc["next_page_token"], "");
  EXPECT_GT(text.size(), kGrpcDefaultLimit);
  uint64_t last = 0;
  for (const auto& n : doc["nodes"]) {
    const uint64_t id = std::stoull(n["id"].get<std::string>());
    EXPECT_GT(id, last);
    last = id;
  }
}

}  // namespace
}  // namespace hicache
