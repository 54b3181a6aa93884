#pragma once

// Publishes the radix tree's tier announcements (tier_listener.h) as KV
// events in vLLM's ZMQ format (kv_event_encoder.h, docs/kv-events.md): the
// contract llm-d's KV-cache indexer, Dynamo's KV router and Mooncake's
// Conductor consume.
//
// Sockets.
//   PUB     every batch as three frames: [topic, seq (8-byte big-endian),
//           msgpack(KVEventBatch)]. Each topic numbers its batches from 0
//           with no gap, as a vLLM instance does. A high-water mark bounds
//           what a slow subscriber can queue (ZMQ drops past it).
//   ROUTER  optional replay: a request [start_seq (8 bytes, big-endian)]
//           (vLLM's, from a DEALER or REQ) gets every buffered batch with
//           seq >= start_seq, each as [topic, seq, payload], then the end
//           marker ["", seq -1, ""]. With a fourth frame naming a topic, only
//           that topic's batches. At most `buffer_batches` are kept.
//   An endpoint is bound when it holds '*' or "::" or is ipc:// or inproc://
//   (vLLM's rule), connected otherwise.
//
// Threads. OnTierEvent runs under the engine's lock and only queues (the
// tokens and hashes are copied). The publisher thread takes the queue and
// has it encoded and sent, in order, by a background worker (idle
// priority: publishing never takes CPU from the serving threads, and lags
// while they keep every CPU busy); the replay thread answers replay
// requests. The first
// batch of each topic is an AllBlocksCleared, so a restarted daemon's
// subscribers forget what its predecessor announced.
//
// Overflow. Past `max_queued_events` waiting events, events are dropped
// (counted) and the publisher asks for a resync (SetResync): the engine
// clears the tree's announcements (AllBlocksCleared on every topic) and
// announces everything again, under its lock, unbounded.
//
// Lock order: the engine's lock before mu_ (OnTierEvent is called under it);
// Declare and the resync call into the engine with no lock of this class
// held.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/core/background_thread.h"
#include "daemon/core/mutex.h"
#include "daemon/events/kv_event.h"
#include "daemon/events/kv_event_encoder.h"
#include "daemon/events/kv_event_topics.h"
#include "daemon/radix/tier_listener.h"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace hicache::events {

struct KvEventPublisherOptions {
  std::string endpoint;         // PUB, e.g. "tcp://*:5557" or "ipc:///run/x".
  std::string replay_endpoint;  // ROUTER; "" = no replay socket.
  int64_t buffer_batches = 10000;     // Kept for replay.
  int64_t hwm = 100000;               // PUB send high-water mark.
  int64_t max_queued_events = 100000;
  int64_t max_batch_events = 512;     // Events per KVEventBatch, at most.
  KvEventFormat format;
  TopicOptions topics;
  // Seconds since the Unix epoch, for the batches' ts (test seam).
  std::function<double()> now;
  // Test seam: the publisher thread calls it (no lock held) each time it has
  // taken the queue, before it sends what it took.
  std::function<void()> before_send;
  // Encoding and sending run on a background thread (BackgroundWorker: only
  // on CPU time the serving threads leave); the publisher thread, which
  // shares a lock with them, keeps the daemon's priority. false: all of it
  // at the daemon's.
  bool background = true;
};

struct KvEventPublisherStats {
  int64_t events_published = 0;   // Events sent on the PUB socket.
  int64_t blocks_published = 0;   // Block hashes in them.
  int64_t batches_published = 0;
  int64_t events_dropped = 0;     // Refused: the queue was full.
  int64_t resyncs = 0;            // Clears and re-announcements after drops.
  int64_t replay_requests = 0;    // Answered.
  int64_t replay_batches = 0;     // Batches sent in answers.
  int64_t replay_refused = 0;     // Malformed requests (no answer).
  int64_t queued_events = 0;      // Waiting now.
};

class KvEventPublisher final : public TierListener {
 public:
  // Binds (or connects) the sockets: INVALID_ARGUMENT or UNAVAILABLE naming
  // the endpoint that failed.
  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> Create(
      KvEventPublisherOptions options);
  // Publishes what is queued, then stops both threads.
  ~KvEventPublisher() override;
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Withdraws `ns`'s blocks, runs `between`, announces them again, all under
  // the engine's lock (HiCacheEngine::ReannounceNamespace).
  using Reannounce =
      std::function<void(absl::string_view ns, absl::FunctionRef<void()>)>;
  // Clears and re-announces every tier (HiCacheEngine::ResyncTierEvents).
  using Resync = std::function<void()>;
  // Set once, before events flow (main); without them a declaration moves
  // nothing already announced and an overflow is never repaired.
  void SetEngineHooks(Reannounce reannounce, Resync resync)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A scheduler declared which engine instance and model serve `ns` (empty:
  // the default). Its events move to that topic: every announced block is
  // removed on the old topic and stored on the new one. INVALID_ARGUMENT for
  // a bad name, FAILED_PRECONDITION if another namespace uses the topic.
  absl::Status Declare(absl::string_view ns, absl::string_view instance,
                       absl::string_view model) ABSL_LOCKS_EXCLUDED(mu_);
  std::string TopicOf(absl::string_view ns) ABSL_LOCKS_EXCLUDED(mu_);

  // TierListener (under the engine's lock).
  void OnTierEvent(const TierEvent& event) override ABSL_LOCKS_EXCLUDED(mu_);
  void OnAllCleared() override ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until every event queued before the call has been sent.
  void Flush() ABSL_LOCKS_EXCLUDED(mu_);
  KvEventPublisherStats stats() const ABSL_LOCKS_EXCLUDED(mu_, buffer_mu_);
  // The endpoints as bound (a tcp port 0 resolved).
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }
  const KvEventFormat& format() const { return encoder_.format(); }

 private:
  // A queued event: its hashes and tokens at these offsets of the queue's
  // buffers (event's views are set once the publisher has taken them).
  struct Queued {
    KvEvent event;
    double ts = 0;
    size_t hashes_at = 0, hashes = 0;
    size_t tokens_at = 0, tokens = 0;
  };
  struct Buffered {
    std::string topic;
    uint64_t seq = 0;
    std::shared_ptr<const std::string> payload;
  };

  KvEventPublisher(KvEventPublisherOptions options, KvEventTopics topics);
  absl::Status Open();
  // Queues `event` (its topic set) with the hashes and tokens of `tier`
  // (null for a clear); false if dropped. `bounded`: subject to
  // max_queued_events (a resync's events are not).
  bool EnqueueLocked(KvEvent event, const TierEvent* tier, bool bounded)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues an AllBlocksCleared for `topic`.
  void QueueClearLocked(const std::string& topic)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double Now() const;  // Seconds since the epoch (options_.now if set).
  void PublishLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void ReplayLoop() ABSL_LOCKS_EXCLUDED(buffer_mu_);
  // Encodes and sends one topic's run of events; buffers it for replay;
  // counts it in *tally. Takes no lock a serving thread takes (it runs in
  // the background): only buffer_mu_.
  void Send(const std::string& topic, absl::Span<const Queued> run,
            KvEventPublisherStats* tally) ABSL_LOCKS_EXCLUDED(mu_, buffer_mu_);

  const KvEventPublisherOptions options_;
  const KvEventEncoder encoder_;
  std::unique_ptr<zmq::context_t> context_;
  std::unique_ptr<zmq::socket_t> pub_;     // The publisher thread's.
  std::unique_ptr<zmq::socket_t> replay_;  // The replay thread's.
  std::string endpoint_;
  std::string replay_endpoint_;
  Reannounce reannounce_;  // Set before events flow, then read-only.
  Resync resync_;

  mutable Mutex mu_;
  CondVar work_cv_;  // The publisher thread: events queued, resync or stop.
  CondVar sent_cv_;  // Flush: more events sent.
  KvEventTopics topics_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> started_topics_ ABSL_GUARDED_BY(mu_);
  std::vector<Queued> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> queue_hashes_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> queue_tokens_ ABSL_GUARDED_BY(mu_);
  int64_t queued_ever_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sent_ever_ ABSL_GUARDED_BY(mu_) = 0;
  bool overflowed_ ABSL_GUARDED_BY(mu_) = false;
  // The publisher thread waits on work_cv_ (queueing signals only then).
  bool publisher_waiting_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  KvEventPublisherStats stats_ ABSL_GUARDED_BY(mu_);
  // The sending thread's own (publisher or background): each topic's next
  // sequence number.
  absl::flat_hash_map<std::string, uint64_t> next_seq_;

  // The replay buffer (publisher thread appends, replay thread reads).
  mutable Mutex buffer_mu_;
  std::deque<Buffered> buffer_ ABSL_GUARDED_BY(buffer_mu_);
  int64_t replay_requests_ ABSL_GUARDED_BY(buffer_mu_) = 0;
  int64_t replay_batches_ ABSL_GUARDED_BY(buffer_mu_) = 0;
  int64_t replay_refused_ ABSL_GUARDED_BY(buffer_mu_) = 0;

  std::unique_ptr<BackgroundWorker> sender_;  // Options::background.
  std::thread publisher_;
  std::thread replayer_;
};

}  // namespace hicache::events
