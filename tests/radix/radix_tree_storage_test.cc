// What the storage tier needs of RadixTree: a node's whole token path
// (PathTokens) and host-only nodes promoted from the stores
// (AttachHostNode), with every refusal leaving the tree unchanged.
#include <string>
#include <vector>

#include "daemon/radix/radix_tree.h"
#include "gtest/gtest.h"
#include "tests/testing/tokens.h"

namespace hicache {
namespace {

using ::hicache::testing::Cat;
using ::hicache::testing::Seq;

constexpr uint32_t kP = 4;

class CountingListener final : public HostTierListener {
 public:
  void OnHostCommitted(HostCommit& c) override {
    ++commits;
    last_key = c.KeyTokens();
  }
  void OnHostReparented(uint64_t, uint64_t) override {}
  void OnHostDropped(uint64_t) override {}
  void OnHostSplit(uint64_t, int64_t, uint64_t) override {}
  int commits = 0;
  std::vector<int32_t> last_key;
};

class RadixTreeStorageTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    auto tree = RadixTree::Create({.page_size = kP,
                                   .cp_size = 2,
                                   .policy = EvictionPolicy::kTinyLfu,
                                   .sketch_pages = 1024,
                                   .prefix_closed_host = GetParam()});
    ASSERT_TRUE(tree.ok());
    tree_ = *std::move(tree);
    tree_->SetHostTierListener(&listener_);
  }
  NodeId InsertOnDevice(const std::vector<int32_t>& tokens) {
    std::vector<LogicalPage> pages((tokens.size() + kP - 1) / kP);
    for (auto& p : pages) p = next_page_++;
    auto r = tree_->Insert("ns", tokens, pages, {});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->node : kNoNode;
  }
  // A host copy of `tokens` tokens, pages alternating between the ranks.
  CpHostMeta Host(int64_t tokens) {
    const int64_t pages = (tokens + kP - 1) / kP;
    std::vector<Rank> owners;
    std::vector<std::vector<int64_t>> host(2);
    for (int64_t i = 0; i < pages; ++i) {
      owners.push_back(static_cast<Rank>(i % 2));
      host[i % 2].push_back(next_host_++);
    }
    return *CpHostMeta::Create(tokens, kP, 2, owners, host);
  }
  TreeStats Stats() const { return tree_->Stats(); }

  std::unique_ptr<RadixTree> tree_;
  CountingListener listener_;
  LogicalPage next_page_ = 10;
  int64_t next_host_ = 1;
};

TEST_P(RadixTreeStorageTest, PathTokensFollowSplits) {
  const NodeId a = InsertOnDevice(Seq(1, 12));
  const NodeId b = InsertOnDevice(Cat(Seq(1, 8), Seq(100, 8)));  // Splits a.
  std::string ns;
  auto path = tree_->PathTokens(b, &ns);
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(*path, Cat(Seq(1, 8), Seq(100, 8)));
  EXPECT_EQ(ns, "ns");
  EXPECT_EQ(*tree_->PathTokens(a, nullptr), Seq(1, 12));
  EXPECT_EQ(tree_->PathTokens(9999, nullptr).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_P(RadixTreeStorageTest, AttachesAHostOnlyNodeUnderTheRoot) {
  auto id = tree_->AttachHostNode("ns", kNoNode, Seq(50, 8), Host(8));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(tree_->CheckInvariants().ok()) << tree_->CheckInvariants();
  EXPECT_EQ(listener_.commits, 1);
  EXPECT_EQ(listener_.last_key, Seq(50, 8));
  auto match = tree_->MatchPrefix("ns", Seq(50, 12), {});
  ASSERT_TRUE(match.ok());
  EXPECT_EQ(match->device_len, 0);
  EXPECT_EQ(match->host_hit_len, 8);
  EXPECT_EQ(match->last_host_node, *id);
  EXPECT_EQ(*tree_->PathTokens(*id, nullptr), Seq(50, 8));
}

TEST_P(RadixTreeStorageTest, AttachesBelowAHostCopy) {
  const NodeId a = InsertOnDevice(Seq(1, 8));
  ASSERT_TRUE(tree_->BeginBackup(a, Host(8)).ok());
  ASSERT_TRUE(tree_->CommitBackup(a).ok());
  auto id = tree_->AttachHostNode("ns", a, Seq(200, 8), Host(8));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(tree_->CheckInvariants().ok()) << tree_->CheckInvariants();
  auto match = tree_->MatchPrefix("ns", Cat(Seq(1, 8), Seq(200, 8)), {});
  ASSERT_TRUE(match.ok());
  EXPECT_EQ(match->device_len, 8);
  EXPECT_EQ(match->host_hit_len, 8);
}

TEST_P(RadixTreeStorageTest, RefusalsChangeNothing) {
  const NodeId a = InsertOnDevice(Seq(1, 8));      // Device only.
  const NodeId tail = InsertOnDevice(Seq(1, 10));  // Ends inside a page.
  const TreeStats before = Stats();
  const int commits = listener_.commits;
  auto code = [&](NodeId parent, const std::vector<int32_t>& key,
                  int64_t host_tokens, absl::string_view ns = "ns") {
    return tree_->AttachHostNode(ns, parent, key, Host(host_tokens))
        .status()
        .code();
  };
  if (GetParam()) {
    // A prefix-closed host tier needs the parent's copy.
    EXPECT_EQ(code(a, Seq(300, 4), 4), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(code(tail, Seq(300, 4), 4), absl::StatusCode::kFailedPrecondition);
  // The root already has a child holding this first page.
  EXPECT_EQ(code(kNoNode, Seq(1, 4), 4), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(code(kNoNode, {}, 4), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(kNoNode, Seq(300, 4), 8), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(a, Seq(300, 4), 4, "other"),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(12345, Seq(300, 4), 4), absl::StatusCode::kNotFound);
  EXPECT_EQ(Stats().nodes, before.nodes);
  EXPECT_EQ(Stats().host_tokens, before.host_tokens);
  EXPECT_EQ(listener_.commits, commits);
  EXPECT_TRUE(tree_->CheckInvariants().ok()) << tree_->CheckInvariants();
}

// A sub-page tail (a request that ended inside the page) where the pages go
// is no conflict: they are attached beside it, as Insert caches an
// extension, and both stay matchable.
TEST_P(RadixTreeStorageTest, AttachesBesideASubPageTail) {
  InsertOnDevice(Seq(70, 2));  // Two tokens: a sub-page tail under the root.
  auto id = tree_->AttachHostNode("ns", kNoNode, Seq(70, 8), Host(8));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(tree_->CheckInvariants().ok()) << tree_->CheckInvariants();
  auto longer = tree_->MatchPrefix("ns", Seq(70, 9), {});
  ASSERT_TRUE(longer.ok());
  EXPECT_EQ(longer->host_hit_len, 8);
  auto tail = tree_->MatchPrefix("ns", Seq(70, 2), {.exact_tail = true});
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(tail->device_len + tail->host_hit_len, 2);
}

INSTANTIATE_TEST_SUITE_P(PrefixClosed, RadixTreeStorageTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "Closed" : "Open";
                         });

}  // namespace
}  // namespace hicache
