// RadixTree::DeviceColdEnd, DevicePagesPerLane and HostCopyCanJoinBelow
// (write-ahead's view of the device tier, issue 25) on a prefix-closed host
// tier at C = 2, P = 4: the cold end in eviction order, each node's copy
// target (itself, or its topmost uncopied ancestor, none while an
// ancestor's copy is in flight or once it has one), the page bound, and
// which parents a new node's copy may join below.
#include <vector>

#include "absl/time/time.h"
#include "daemon/core/clock.h"
#include "daemon/radix/radix_tree.h"
#include "gtest/gtest.h"
#include "tests/testing/tokens.h"

namespace hicache {
namespace {

using ::hicache::testing::Cat;
using ::hicache::testing::Seq;

constexpr uint32_t kP = 4;
constexpr uint32_t kCp = 2;

class ColdEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tree = RadixTree::Create({.page_size = kP,
                                   .cp_size = kCp,
                                   .policy = EvictionPolicy::kLru,
                                   .clock = &clock_,
                                   .prefix_closed_host = true});
    ASSERT_TRUE(tree.ok()) << tree.status();
    tree_ = *std::move(tree);
  }
  void TearDown() override {
    EXPECT_TRUE(tree_->CheckInvariants().ok()) << tree_->CheckInvariants();
  }
  // Inserts `tokens` with fresh pages (lanes alternate: page % 2); returns
  // the node of its last token. The clock moves on after each.
  NodeId Insert(const std::vector<int32_t>& tokens) {
    std::vector<LogicalPage> pages((tokens.size() + kP - 1) / kP);
    for (auto& p : pages) p = next_page_++;
    auto result = tree_->Insert("", tokens, pages);
    EXPECT_TRUE(result.ok()) << result.status();
    clock_.Advance(absl::Seconds(1));
    return result.ok() ? result->node : kNoNode;
  }
  absl::Status Begin(NodeId node) {
    auto info = tree_->Inspect(node);
    if (!info.ok()) return info.status();
    std::vector<std::vector<int64_t>> host(kCp);
    for (Rank owner : info->page_owners) host[owner].push_back(next_host_++);
    auto meta = CpHostMeta::Create(info->len, kP, kCp, info->page_owners, host);
    if (!meta.ok()) return meta.status();
    return tree_->BeginBackup(node, *std::move(meta));
  }
  const ColdNode* Find(const std::vector<ColdNode>& cold, NodeId node) {
    for (const ColdNode& c : cold) {
      if (c.node == node) return &c;
    }
    return nullptr;
  }

  FakeClock clock_;
  std::unique_ptr<RadixTree> tree_;
  LogicalPage next_page_ = 10;
  int64_t next_host_ = 0;
};

TEST_F(ColdEndTest, EvictionOrderWithTheTopmostUncopiedAncestorFirst) {
  // a (2 pages) <- b (1 page) <- c (3 pages): a chain; d a sibling of a.
  const NodeId a = Insert(Seq(0, 8));
  const NodeId b = Insert(Cat(Seq(0, 8), Seq(100, 4)));
  const NodeId c = Insert(Cat(Cat(Seq(0, 8), Seq(100, 4)), Seq(200, 12)));
  const NodeId d = Insert(Seq(500, 4));
  std::vector<ColdNode> cold = tree_->DeviceColdEnd(1 << 20);
  // Leaves in LRU order, a parent once its last device child is taken: c's
  // insert touched a and b, so they come before d.
  ASSERT_EQ(cold.size(), 4u);
  EXPECT_EQ(cold[0].node, c);
  EXPECT_EQ(cold[0].device_pages, 3);
  EXPECT_EQ(cold[0].copy_target, a);  // Nothing above it has a copy.
  EXPECT_EQ(cold[1].node, b);
  EXPECT_EQ(cold[1].copy_target, a);
  EXPECT_EQ(cold[2].node, a);
  EXPECT_EQ(cold[2].device_pages, 2);
  EXPECT_EQ(cold[2].copy_target, a);
  EXPECT_EQ(cold[3].node, d);
  EXPECT_EQ(cold[3].copy_target, d);  // A root child.
  EXPECT_LT(cold[0].last_access_ns, cold[3].last_access_ns);

  // a's copy in flight: nothing below it may start yet.
  ASSERT_TRUE(Begin(a).ok());
  cold = tree_->DeviceColdEnd(1 << 20);
  EXPECT_EQ(Find(cold, c)->copy_target, kNoNode);
  EXPECT_EQ(Find(cold, b)->copy_target, kNoNode);
  EXPECT_EQ(Find(cold, a), nullptr);  // A backup in flight keeps it.
  // Committed: b comes next for c, then c itself.
  ASSERT_TRUE(tree_->CommitBackup(a).ok());
  cold = tree_->DeviceColdEnd(1 << 20);
  EXPECT_EQ(Find(cold, c)->copy_target, b);
  EXPECT_EQ(Find(cold, b)->copy_target, b);
  ASSERT_TRUE(Begin(b).ok());
  ASSERT_TRUE(tree_->CommitBackup(b).ok());
  EXPECT_EQ(Find(tree_->DeviceColdEnd(1 << 20), c)->copy_target, c);
  // A child below an uncopied parent cannot begin (prefix-closed).
  const NodeId e = Insert(Cat(Seq(500, 4), Seq(600, 4)));
  EXPECT_FALSE(Begin(e).ok());
  EXPECT_EQ(Find(tree_->DeviceColdEnd(1 << 20), e)->copy_target, d);
}

TEST_F(ColdEndTest, StopsOnceTheListedNodesHoldMaxPages) {
  const NodeId first = Insert(Seq(0, 12));  // 3 pages, coldest.
  Insert(Seq(100, 8));                      // 2 pages.
  Insert(Seq(200, 8));                      // 2 pages.
  std::vector<ColdNode> cold = tree_->DeviceColdEnd(3);
  ASSERT_EQ(cold.size(), 1u);
  EXPECT_EQ(cold[0].node, first);
  EXPECT_EQ(tree_->DeviceColdEnd(4).size(), 2u);
  EXPECT_EQ(tree_->DeviceColdEnd(0).size(), 0u);
}

TEST_F(ColdEndTest, HostCopyCanJoinBelowACopiedParentOnly) {
  const NodeId parent = Insert(Seq(0, 8));
  EXPECT_TRUE(tree_->HostCopyCanJoinBelow(kNoNode));  // A new root child.
  EXPECT_FALSE(tree_->HostCopyCanJoinBelow(parent));  // Device only.
  ASSERT_TRUE(Begin(parent).ok());
  EXPECT_TRUE(tree_->HostCopyCanJoinBelow(parent));  // Its copy in flight.
  ASSERT_TRUE(tree_->CommitBackup(parent).ok());
  EXPECT_TRUE(tree_->HostCopyCanJoinBelow(parent));
  EXPECT_FALSE(tree_->HostCopyCanJoinBelow(424242));  // Unknown.
  // Without a prefix-closed tier any parent will do.
  auto open = RadixTree::Create({.page_size = kP, .cp_size = kCp});
  ASSERT_TRUE(open.ok());
  auto inserted = (*open)->Insert("", Seq(0, 8), {1, 2});
  ASSERT_TRUE(inserted.ok());
  EXPECT_TRUE((*open)->HostCopyCanJoinBelow(inserted->node));
}

TEST_F(ColdEndTest, DevicePagesPerLane) {
  // Pages 10, 11, 12: lanes 0, 1, 0.
  const NodeId node = Insert(Seq(0, 12));
  auto lanes = tree_->DevicePagesPerLane(node);
  ASSERT_TRUE(lanes.ok()) << lanes.status();
  EXPECT_EQ(*lanes, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(tree_->DevicePagesPerLane(424242).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace hicache
