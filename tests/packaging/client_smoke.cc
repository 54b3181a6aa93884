// Built by deb_package_test.sh against the unpacked .deb only (headers,
// libhicache_client.a and hicache-client.pc through pkg-config): asks the
// daemon at argv[1] for its health and its build, using the generated proto
// types the installed headers expose.
#include <iostream>

#include "client/cpp/endpoint.h"
#include "client/cpp/hicache_client.h"
#include "hicache/v1/hicache.pb.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: client_smoke SOCKET\n";
    return 2;
  }
  auto client = hicache::client::HiCacheClient::Create(
      hicache::client::UnixTarget(argv[1]));
  if (!client.ok()) {
    std::cerr << client.status() << "\n";
    return 1;
  }
  auto health = (*client)->CheckHealth("", absl::Seconds(20));
  if (!health.ok()) {
    std::cerr << "health: " << health.status() << "\n";
    return 1;
  }
  auto stats = (*client)->GetStats();
  if (!stats.ok()) {
    std::cerr << "stats: " << stats.status() << "\n";
    return 1;
  }
  std::cout << hicache::client::ServingStatusName(*health) << " "
            << stats->build().version() << "\n";
  return 0;
}
