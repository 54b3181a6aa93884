// ConnectionRegistry: peer credentials by descriptor, guarded against
// descriptor reuse, and the operator policy.
#include "daemon/main/connection_registry.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

ino_t InodeOf(int fd) {
  struct stat st;
  EXPECT_EQ(fstat(fd, &st), 0);
  return st.st_ino;
}

TEST(OperatorPolicyTest, RootListedUidsAndGroups) {
  OperatorPolicy policy{.uids = {1000}, .gids = {50}, .cert_names = {"ops"}};
  EXPECT_TRUE(policy.IsOperator({.uid = 0, .gid = 0}));
  EXPECT_TRUE(policy.IsOperator({.uid = 1000, .gid = 1000}));
  EXPECT_TRUE(policy.IsOperator({.uid = 1001, .gid = 50}));
  EXPECT_TRUE(policy.IsOperator({.uid = 1001, .gid = 1001, .groups = {7, 50}}));
  EXPECT_FALSE(policy.IsOperator({.uid = 1001, .gid = 1001, .groups = {7}}));
  EXPECT_TRUE(policy.IsOperatorCert("ops"));
  EXPECT_FALSE(policy.IsOperatorCert(""));
  EXPECT_FALSE(policy.IsOperatorCert("dev"));
}

TEST(ConnectionRegistryTest, ResolvesByDescriptorAndRefusesReuse) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  ConnectionRegistry registry(OperatorPolicy{.uids = {1000}});
  registry.Add(pair[0], InodeOf(pair[0]), {.pid = 5, .uid = 1000});
  registry.Add(pair[1], InodeOf(pair[1]), {.pid = 6, .uid = 2000});
  const Caller op = registry.ResolvePeer(absl::StrCat("fd:", pair[0]), {});
  EXPECT_TRUE(op.is_operator);
  EXPECT_EQ(op.name, "uid 1000 pid 5");
  EXPECT_EQ(op.principal, "uid 1000");  // Stable across its processes.
  const Caller client =
      registry.ResolvePeer(absl::StrCat("fd:", pair[1]), {});
  EXPECT_FALSE(client.is_operator);
  EXPECT_EQ(client.principal, "uid 2000");
  EXPECT_FALSE(registry.ResolvePeer("unix:/x", {}).is_operator);
  EXPECT_EQ(registry.ResolvePeer("unix:/x", {}).principal, "");
  EXPECT_FALSE(registry.ResolvePeer("fd:notanumber", {}).is_operator);

  // The operator's connection closes and its number is reused by another
  // socket: the old credentials must not carry over.
  const int fd = pair[0];
  close(pair[0]);
  int other[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, other), 0);
  if (other[0] != fd) {
    ASSERT_EQ(dup2(other[0], fd), fd);
  }
  EXPECT_FALSE(registry.ResolvePeer(absl::StrCat("fd:", fd), {}).is_operator);
  EXPECT_EQ(registry.Sweep(), 1u);  // Only pair[1] is still what it was.
  close(fd);
  close(pair[1]);
  close(other[0]);
  close(other[1]);
}

TEST(ConnectionRegistryTest, TlsCertificateNames) {
  ConnectionRegistry registry(OperatorPolicy{.cert_names = {"ops"}});
  EXPECT_TRUE(registry.ResolvePeer("ipv4:1.2.3.4:5", {"ops"}).is_operator);
  const Caller dev = registry.ResolvePeer("ipv4:1.2.3.4:5", {"dev"});
  EXPECT_FALSE(dev.is_operator);
  EXPECT_EQ(dev.name, "certificate CN=dev");
  EXPECT_EQ(dev.principal, "cert CN=dev");
  // A TCP peer no certificate names: bound to its address, not its port.
  EXPECT_EQ(registry.ResolvePeer("ipv4:1.2.3.4:5", {}).principal,
            "host ipv4:1.2.3.4");
  EXPECT_EQ(registry.ResolvePeer("ipv4:1.2.3.4:6", {}).principal,
            "host ipv4:1.2.3.4");
  EXPECT_EQ(registry.ResolvePeer("ipv6:[::1]:7", {}).principal,
            "host ipv6:[::1]");
  EXPECT_EQ(registry.ResolvePeer("ipv4:5.6.7.8:5", {}).principal,
            "host ipv4:5.6.7.8");
}

}  // namespace
}  // namespace hicache
