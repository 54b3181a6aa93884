// The follower end of a Gloo link in a process of its own, for
// gloo_two_process_test: connects as rank 1 and echoes every frame back.
//
//   gloo_link_peer <store dir> <key prefix> <receive timeout ms>
//
// Runs until the link fails, prints the cause on stderr ("link failed:
// <status>") and exits 0 if it had echoed a frame "bye" before, 3 if not;
// 2 on a usage or connect error.

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "daemon/comm/gloo_communicator.h"
#include "gloo/rendezvous/file_store.h"

int main(int argc, char** argv) {
  using hicache::comm::GlooCommunicator;
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s DIR PREFIX TIMEOUT_MS\n", argv[0]);
    return 2;
  }
  gloo::rendezvous::FileStore store(argv[1]);
  auto device = GlooCommunicator::CreateTcpDevice("127.0.0.1");
  if (!device.ok()) {
    std::fprintf(stderr, "%s\n", device.status().ToString().c_str());
    return 2;
  }
  hicache::comm::GlooLinkOptions options;
  options.store = &store;
  options.key_prefix = argv[2];
  options.rank = 1;
  options.device = *device;
  options.receive_timeout = absl::Milliseconds(std::atoi(argv[3]));
  options.peer_name = "test leader";
  auto link = GlooCommunicator::Connect(options);
  if (!link.ok()) {
    std::fprintf(stderr, "connect: %s\n", link.status().ToString().c_str());
    return 2;
  }
  std::promise<int> exit_code;
  std::atomic<bool> saw_bye{false};
  GlooCommunicator& l = **link;
  const absl::Status started = l.Start(
      [&](absl::string_view frame) {
        (void)l.Send(std::string(frame));
        if (frame == "bye") saw_bye = true;
      },
      [&](const absl::Status& cause) {
        std::fprintf(stderr, "link failed: %s\n", cause.ToString().c_str());
        exit_code.set_value(saw_bye ? 0 : 3);
      });
  if (!started.ok()) {
    std::fprintf(stderr, "start: %s\n", started.ToString().c_str());
    return 2;
  }
  const int code = exit_code.get_future().get();
  std::fflush(stderr);
  std::_Exit(code);  // No destructors: the link is already down.
}
