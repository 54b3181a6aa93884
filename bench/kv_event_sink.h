#pragma once

// A router's subscriber for benchmarks, in a process of its own as routers
// are: it connects a SUB socket to a KV-event endpoint and receives every
// batch (without decoding it), so the publisher's cost is measured with the
// sockets' real work on both ends but without a router's in the process
// that publishes.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace hicache::bench {

struct KvEventSinkCounts {
  int64_t batches = 0;  // Messages of three frames received.
  int64_t bytes = 0;    // Their payload (the msgpack batches).
};

class KvEventSink {
 public:
  // Starts `binary` (normally /proc/self/exe) with
  // `--kv_event_sink=ENDPOINT` and waits until its SUB socket is connected
  // and subscribed. The binary must call RunKvEventSink for that flag.
  static absl::StatusOr<std::unique_ptr<KvEventSink>> Start(
      const std::string& binary, const std::string& endpoint);
  // Kills the process if Stop() was not called.
  ~KvEventSink();
  KvEventSink(const KvEventSink&) = delete;
  KvEventSink& operator=(const KvEventSink&) = delete;

  // Tells the process to stop once the stream has been quiet for a moment
  // (what was sent before the call arrives first) and returns its counts.
  absl::StatusOr<KvEventSinkCounts> Stop();

 private:
  KvEventSink() = default;
  pid_t pid_ = -1;
  int to_child_ = -1;    // Closed: stop.
  int from_child_ = -1;  // "ready\n", then the counts.
};

// The child's side: subscribes to `endpoint`, writes "ready\n" to stdout,
// counts batches until stdin is closed and the stream has been quiet for
// 200 ms, then writes "BATCHES BYTES\n". Returns the process's exit code.
int RunKvEventSink(const std::string& endpoint);

}  // namespace hicache::bench
