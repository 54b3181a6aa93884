// RadixTree: a host reference keeps its node in the tree through device
// eviction (issue 25, "releasing the host reference of node N: NOT_FOUND").
//
// Reproduction: under exclusive tiering a backed child can hang under an
// unbacked parent. Write-back staging takes a host reference on the backed
// child; the same EvictDevice call first demotes the child to host-only,
// then evicts the parent, whose removal took its host-only descendants with
// it, the referenced child included. The release that followed found no
// node. Before the fix, KeepsTheReferencedNodeAndItsParent failed at its
// first Inspect.
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/core/clock.h"
#include "daemon/radix/radix_tree.h"
#include "gtest/gtest.h"
#include "tests/testing/tokens.h"

namespace hicache {
namespace {

using ::hicache::testing::Seq;

constexpr uint32_t kP = 4;

class HostRefEvictionTest : public ::testing::TestWithParam<EvictionPolicy> {
 protected:
  void SetUp() override {
    auto tree = RadixTree::Create(
        {.page_size = kP, .cp_size = 2, .policy = GetParam(), .clock = &clock_});
    ASSERT_TRUE(tree.ok());
    tree_ = *std::move(tree);
  }
  void TearDown() override {
    EXPECT_TRUE(tree_->CheckInvariants().ok()) << tree_->CheckInvariants();
  }
  NodeId Insert(const std::vector<int32_t>& tokens) {
    std::vector<LogicalPage> pages(tokens.size() / kP);
    for (auto& p : pages) p = next_page_++;
    auto result = tree_->Insert("", tokens, pages);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? result->node : kNoNode;
  }
  void Backup(NodeId node) {
    NodeInfo info = *tree_->Inspect(node);
    std::vector<std::vector<int64_t>> host(2);
    for (Rank owner : info.page_owners) host[owner].push_back(next_host_++);
    ASSERT_TRUE(tree_
                    ->BeginBackup(node, *CpHostMeta::Create(
                                            info.len, kP, 2, info.page_owners,
                                            host))
                    .ok());
    ASSERT_TRUE(tree_->CommitBackup(node).ok());
  }
  // An unbacked parent [0, 8) with a backed child [8, 16), the child held.
  void BuildHeldChild() {
    parent_ = Insert(Seq(0, 8));
    clock_.Advance(absl::Seconds(1));
    child_ = Insert(Seq(0, 16));
    ASSERT_NE(child_, parent_);
    Backup(child_);
    ASSERT_EQ(tree_->Inspect(child_)->parent, parent_);
    ASSERT_TRUE(tree_->AddHostRef(child_).ok());  // As write-back staging.
  }

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  std::unique_ptr<RadixTree> tree_;
  LogicalPage next_page_ = 100;
  int64_t next_host_ = 0;
  NodeId parent_ = kNoNode;
  NodeId child_ = kNoNode;
};

TEST_P(HostRefEvictionTest, KeepsTheReferencedNodeAndItsParent) {
  ASSERT_NO_FATAL_FAILURE(BuildHeldChild());
  DeviceEvictResult e = tree_->EvictDeviceTokens(16);
  ASSERT_TRUE(tree_->Inspect(child_).ok()) << "the held child was removed";
  EXPECT_EQ(tree_->Inspect(child_)->host_ref, 1);
  EXPECT_EQ(tree_->Inspect(child_)->tier, NodeTier::kHost);  // Demoted.
  ASSERT_TRUE(tree_->Inspect(parent_).ok());
  EXPECT_EQ(tree_->Inspect(parent_)->tier, NodeTier::kDevice);  // Kept.
  EXPECT_EQ(e.nodes_to_host, 1);
  EXPECT_EQ(e.nodes_removed, 0);
  EXPECT_EQ(e.victims_held_by_host_refs, 1);
  EXPECT_TRUE(tree_->CheckInvariants().ok()) << tree_->CheckInvariants();

  // Released, the next eviction takes both, as before.
  ASSERT_TRUE(tree_->ReleaseHostRef(child_).ok());
  e = tree_->EvictDeviceTokens(8);
  EXPECT_EQ(e.nodes_removed, 1);
  EXPECT_FALSE(tree_->Inspect(parent_).ok());
  EXPECT_FALSE(tree_->Inspect(child_).ok());
  EXPECT_EQ(e.freed_host_pages[0].size() + e.freed_host_pages[1].size(), 2u);
}

// The same through the owner-lane path (per-lane targets, with its ancestor
// unlocking): the held subtree is never a target, and the call ends.
TEST_P(HostRefEvictionTest, PerLaneEvictionLeavesTheHeldSubtree) {
  ASSERT_NO_FATAL_FAILURE(BuildHeldChild());
  const NodeId other = Insert(Seq(500, 16));
  tree_->EvictDevice({8, 8});
  ASSERT_TRUE(tree_->Inspect(child_).ok()) << "the held child was removed";
  EXPECT_EQ(tree_->Inspect(child_)->host_ref, 1);
  EXPECT_TRUE(tree_->Inspect(parent_).ok());
  EXPECT_FALSE(tree_->Inspect(other).ok());  // Unrelated: evicted.
  ASSERT_TRUE(tree_->ReleaseHostRef(child_).ok());
}

INSTANTIATE_TEST_SUITE_P(Policies, HostRefEvictionTest,
                         ::testing::Values(EvictionPolicy::kLru,
                                           EvictionPolicy::kTinyLfu),
                         [](const auto& info) {
                           return std::string(PolicyName(info.param));
                         });

}  // namespace
}  // namespace hicache
