#pragma once

// Connects both ends of a Gloo link inside one process (two threads, two TCP
// devices on 127.0.0.1, a FileStore per end over one directory, as two
// daemons would have), for the Gloo tests and the comm benchmark. One
// FileStore must not be shared by concurrent Connects: Gloo's FileStore
// records the keys it set in an unguarded member.

#include <future>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/comm/gloo_communicator.h"
#include "gloo/rendezvous/file_store.h"

namespace hicache::comm::testing {

struct GlooLinkPair {
  std::unique_ptr<GlooCommunicator> leader;    // rank 0
  std::unique_ptr<GlooCommunicator> follower;  // rank 1
};

class GlooLinkFactory {
 public:
  // `dir`: an existing, empty directory for the FileStore.
  explicit GlooLinkFactory(const std::string& dir)
      : stores_{gloo::rendezvous::FileStore(dir),
                gloo::rendezvous::FileStore(dir)} {}

  // The TCP device of daemon `i` (0 or 1), created on first use.
  absl::StatusOr<std::shared_ptr<gloo::transport::Device>> Device(int i) {
    if (devices_[i] == nullptr) {
      auto device = GlooCommunicator::CreateTcpDevice("127.0.0.1");
      if (!device.ok()) return device.status();
      devices_[i] = *std::move(device);
    }
    return devices_[i];
  }

  GlooLinkOptions Options(int rank, const std::string& prefix,
                          absl::Duration receive_timeout) {
    GlooLinkOptions o;
    o.store = &stores_[rank];
    o.key_prefix = prefix;
    o.rank = rank;
    o.connect_timeout = absl::Seconds(30);
    o.receive_timeout = receive_timeout;
    o.peer_name = rank == 0 ? "follower" : "leader";
    return o;
  }

  // Both ends of a fresh link (a new key prefix each time).
  absl::StatusOr<GlooLinkPair> Connect(
      absl::Duration leader_timeout = absl::Seconds(30),
      absl::Duration follower_timeout = absl::Seconds(30)) {
    const std::string prefix = "link" + std::to_string(next_++);
    GlooLinkOptions lo = Options(0, prefix, leader_timeout);
    GlooLinkOptions fo = Options(1, prefix, follower_timeout);
    for (int i = 0; i < 2; ++i) {
      auto device = Device(i);
      if (!device.ok()) return device.status();
      (i == 0 ? lo : fo).device = *device;
    }
    auto follower = std::async(std::launch::async, [fo] {
      return GlooCommunicator::Connect(fo);
    });
    auto leader = GlooCommunicator::Connect(lo);
    auto f = follower.get();
    if (!leader.ok()) return leader.status();
    if (!f.ok()) return f.status();
    return GlooLinkPair{*std::move(leader), *std::move(f)};
  }

  // The store of the end with `rank`.
  gloo::rendezvous::Store& store(int rank) { return stores_[rank]; }

 private:
  gloo::rendezvous::FileStore stores_[2];
  std::shared_ptr<gloo::transport::Device> devices_[2];
  int next_ = 0;
};

}  // namespace hicache::comm::testing
