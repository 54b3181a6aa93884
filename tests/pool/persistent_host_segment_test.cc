// OpenPersistentHostSegment / RemovePersistentHostSegments on real /dev/shm
// segments: attach keeps the bytes, another fingerprint is removed, and a
// daemon without hot restart removes every tagged host segment of its
// prefix, and nothing else.
#include "daemon/pool/persistent_host_segment.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

bool Exists(const std::string& shm_name) {
  return access(absl::StrCat("/dev/shm", shm_name).c_str(), F_OK) == 0;
}

class PersistentHostSegmentTest : public ::testing::Test {
 protected:
  void TearDown() override {
    (void)RemovePersistentHostSegments(prefix_);
    shm_unlink((prefix_ + "-host-r0").c_str());
  }
  const std::string prefix_ = absl::StrCat("/hicache-phstest", getpid());
};

TEST_F(PersistentHostSegmentTest, CreatesThenAttachesKeepingTheBytes) {
  {
    auto segment = OpenPersistentHostSegment(prefix_, 0, 4096, false, 0xabc);
    ASSERT_TRUE(segment.ok()) << segment.status();
    EXPECT_FALSE(segment->attached);
    EXPECT_TRUE(segment->pool->kept());
    std::memcpy(segment->pool->host_data(), "hot restart", 12);
  }
  const std::string name = ShmPool::PersistentHostName(prefix_, 0, 0xabc);
  EXPECT_TRUE(Exists(name));  // Kept by the destructor.
  auto again = OpenPersistentHostSegment(prefix_, 0, 4096, false, 0xabc);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->attached);
  EXPECT_STREQ(static_cast<const char*>(again->pool->host_data()),
               "hot restart");
}

TEST_F(PersistentHostSegmentTest, AnotherGeometryIsRemovedAndStartsCold) {
  { ASSERT_TRUE(OpenPersistentHostSegment(prefix_, 0, 4096, false, 1).ok()); }
  // Rank 10's segment is not rank 1's, nor rank 0's.
  { ASSERT_TRUE(OpenPersistentHostSegment(prefix_, 10, 4096, false, 1).ok()); }
  auto other = OpenPersistentHostSegment(prefix_, 0, 8192, false, 2);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_FALSE(other->attached);
  EXPECT_THAT(other->removed,
              ElementsAre(ShmPool::PersistentHostName(prefix_, 0, 1)));
  EXPECT_FALSE(Exists(ShmPool::PersistentHostName(prefix_, 0, 1)));
  EXPECT_TRUE(Exists(ShmPool::PersistentHostName(prefix_, 10, 1)));
  auto rank1 = OpenPersistentHostSegment(prefix_, 1, 4096, false, 3);
  ASSERT_TRUE(rank1.ok());
  EXPECT_TRUE(rank1->removed.empty());
  EXPECT_TRUE(Exists(ShmPool::PersistentHostName(prefix_, 10, 1)));
}

TEST_F(PersistentHostSegmentTest, RemoveTakesEveryTaggedHostSegmentOnly) {
  { ASSERT_TRUE(OpenPersistentHostSegment(prefix_, 0, 4096, false, 5).ok()); }
  { ASSERT_TRUE(OpenPersistentHostSegment(prefix_, 3, 4096, false, 6).ok()); }
  // An ordinary (untagged) pool of the same prefix stays.
  auto plain = ShmPool::Create(prefix_ + "-host-r0", 4096, false);
  ASSERT_TRUE(plain.ok()) << plain.status();
  (*plain)->Keep();
  EXPECT_THAT(RemovePersistentHostSegments(prefix_),
              UnorderedElementsAre(ShmPool::PersistentHostName(prefix_, 0, 5),
                                   ShmPool::PersistentHostName(prefix_, 3, 6)));
  EXPECT_TRUE(Exists(prefix_ + "-host-r0"));
  EXPECT_TRUE(RemovePersistentHostSegments(prefix_).empty());
}

}  // namespace
}  // namespace hicache
