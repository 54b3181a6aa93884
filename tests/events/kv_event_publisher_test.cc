// The publisher over real ZMQ sockets (ipc:// in a temporary directory): the
// frames of vLLM's protocol, per-topic sequence numbers, replay, overflow
// and resync, and topic moves against a real RadixTree.
#include "daemon/events/kv_event_publisher.h"

#include <array>
#include <atomic>
#include <cstring>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "daemon/radix/radix_tree.h"
#include "gtest/gtest.h"
#include "msgpack.hpp"
#include "tests/testing/temp_dir.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace hicache::events {
namespace {

struct Batch {
  std::string topic;
  int64_t seq = 0;
  std::vector<std::string> types;  // Each event's "type".
  std::vector<std::vector<uint64_t>> hashes;
  std::vector<std::string> media;
};

int64_t Seq(const zmq::message_t& frame) {
  EXPECT_EQ(frame.size(), 8u);
  uint64_t v = 0;
  const auto* b = static_cast<const unsigned char*>(frame.data());
  for (int i = 0; i < 8; ++i) v = (v << 8) | b[i];
  return static_cast<int64_t>(v);
}

Batch Decode(const std::string& topic, int64_t seq,
             const zmq::message_t& payload) {
  Batch batch{topic, seq, {}, {}, {}};
  msgpack::object_handle handle = msgpack::unpack(
      static_cast<const char*>(payload.data()), payload.size());
  const msgpack::object& root = handle.get();
  EXPECT_EQ(root.type, msgpack::type::ARRAY);
  EXPECT_EQ(root.via.array.size, 3u);
  const msgpack::object& events = root.via.array.ptr[1];
  for (uint32_t i = 0; i < events.via.array.size; ++i) {
    const msgpack::object& e = events.via.array.ptr[i];
    std::string type, medium;
    std::vector<uint64_t> hashes;
    for (uint32_t k = 0; k < e.via.map.size; ++k) {
      const std::string key = e.via.map.ptr[k].key.as<std::string>();
      if (key == "type") type = e.via.map.ptr[k].val.as<std::string>();
      if (key == "medium") medium = e.via.map.ptr[k].val.as<std::string>();
      if (key == "block_hashes") {
        hashes = e.via.map.ptr[k].val.as<std::vector<uint64_t>>();
      }
    }
    batch.types.push_back(type);
    batch.hashes.push_back(hashes);
    batch.media.push_back(medium);
  }
  return batch;
}

class PublisherTest : public ::testing::Test {
 protected:
  KvEventPublisherOptions Options() {
    KvEventPublisherOptions options;
    options.endpoint = "ipc://" + dir_.Child("pub");
    options.replay_endpoint = "ipc://" + dir_.Child("replay");
    options.format.block_size = 4;
    options.topics.instance = "node";
    options.now = [] { return 1.0; };
    return options;
  }

  void Start(KvEventPublisherOptions options) {
    absl::StatusOr<std::unique_ptr<KvEventPublisher>> p =
        KvEventPublisher::Create(std::move(options));
    ASSERT_TRUE(p.ok()) << p.status();
    publisher_ = *std::move(p);
    sub_.connect(publisher_->endpoint());
    sub_.set(zmq::sockopt::subscribe, "");
    // The subscription travels to the PUB socket asynchronously: publish a
    // probe until it arrives (no deadline: only its arrival is waited for).
    sub_.set(zmq::sockopt::rcvtimeo, 50);
    while (true) {
      Event("probe", TierEvent::Kind::kStored, {99});
      std::vector<zmq::message_t> frames;
      if (zmq::recv_multipart(sub_, std::back_inserter(frames))) break;
    }
    sub_.set(zmq::sockopt::rcvtimeo, -1);
    publisher_->Flush();
    // Drain the probes still in flight (their topic only).
    sub_.set(zmq::sockopt::rcvtimeo, 0);
    std::vector<zmq::message_t> frames;
    while (zmq::recv_multipart(sub_, std::back_inserter(frames))) {
      frames.clear();
    }
    sub_.set(zmq::sockopt::rcvtimeo, -1);
  }

  void Event(absl::string_view ns, TierEvent::Kind kind,
             std::vector<uint64_t> hashes, Tier tier = Tier::kDevice) {
    std::vector<int32_t> tokens(hashes.size() * 4, 7);
    const std::vector<absl::Span<const int32_t>> pieces = {tokens};
    TierEvent e;
    e.kind = kind;
    e.tier = tier;
    e.ns = ns;
    e.block_hashes = hashes;
    if (kind == TierEvent::Kind::kStored) e.tokens = pieces;
    publisher_->OnTierEvent(e);
  }

  // The next batch on the PUB socket that is not a probe's.
  Batch Next() {
    while (true) {
      std::vector<zmq::message_t> frames;
      EXPECT_TRUE(zmq::recv_multipart(sub_, std::back_inserter(frames)));
      EXPECT_EQ(frames.size(), 3u);
      const std::string topic = frames[0].to_string();
      if (topic == publisher_->TopicOf("probe")) continue;
      return Decode(topic, Seq(frames[1]), frames[2]);
    }
  }

  // Asks the replay socket from `start` (optionally one topic).
  std::vector<Batch> Replay(int64_t start, std::string topic = "",
                            bool with_topic = false) {
    zmq::socket_t dealer(ctx_, zmq::socket_type::dealer);
    dealer.connect(publisher_->replay_endpoint());
    std::array<char, 8> seq;
    for (int i = 0; i < 8; ++i) {
      seq[i] = static_cast<char>(static_cast<uint64_t>(start) >> (56 - 8 * i));
    }
    std::vector<zmq::const_buffer> request = {zmq::const_buffer(),
                                              zmq::buffer(seq)};
    if (with_topic) request.push_back(zmq::buffer(topic));
    zmq::send_multipart(dealer, request);
    std::vector<Batch> out;
    while (true) {
      std::vector<zmq::message_t> frames;
      EXPECT_TRUE(zmq::recv_multipart(dealer, std::back_inserter(frames)));
      EXPECT_EQ(frames.size(), 4u);  // "", topic, seq, payload.
      EXPECT_EQ(frames[0].size(), 0u);
      if (Seq(frames[2]) == -1) {
        EXPECT_EQ(frames[1].size(), 0u);
        EXPECT_EQ(frames[3].size(), 0u);
        return out;
      }
      out.push_back(Decode(frames[1].to_string(), Seq(frames[2]), frames[3]));
    }
  }

  testing::TempDir dir_;
  zmq::context_t ctx_;
  zmq::socket_t sub_{ctx_, zmq::socket_type::sub};
  std::unique_ptr<KvEventPublisher> publisher_;
};

TEST_F(PublisherTest, EachTopicStartsWithAClearAndCountsWithoutGaps) {
  ASSERT_NO_FATAL_FAILURE(Start(Options()));
  Event("a", TierEvent::Kind::kStored, {1, 2});
  publisher_->Flush();
  Event("b", TierEvent::Kind::kStored, {3});
  publisher_->Flush();
  Event("a", TierEvent::Kind::kRemoved, {2}, Tier::kDevice);
  publisher_->Flush();
  Batch a0 = Next();
  EXPECT_EQ(a0.topic, "kv@node@a");
  EXPECT_EQ(a0.seq, 0);
  EXPECT_EQ(a0.types,
            (std::vector<std::string>{"AllBlocksCleared", "BlockStored"}));
  EXPECT_EQ(a0.hashes[1], (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(a0.media[1], "GPU");
  Batch b0 = Next();
  EXPECT_EQ(b0.topic, "kv@node@b");
  EXPECT_EQ(b0.seq, 0);  // Its own numbering.
  Batch a1 = Next();
  EXPECT_EQ(a1.topic, "kv@node@a");
  EXPECT_EQ(a1.seq, 1);
  EXPECT_EQ(a1.types, (std::vector<std::string>{"BlockRemoved"}));
  const KvEventPublisherStats stats = publisher_->stats();
  EXPECT_EQ(stats.events_dropped, 0);
  EXPECT_GE(stats.batches_published, 3);
}

TEST_F(PublisherTest, ReplaySendsTheBufferFromASequenceNumber) {
  KvEventPublisherOptions options = Options();
  options.buffer_batches = 3;
  ASSERT_NO_FATAL_FAILURE(Start(options));
  for (uint64_t h = 1; h <= 4; ++h) {
    Event("a", TierEvent::Kind::kStored, {h});
    publisher_->Flush();
  }
  Event("b", TierEvent::Kind::kStored, {50});
  publisher_->Flush();
  // Buffer of 3: a's seq 2 and 3, b's seq 0.
  std::vector<Batch> all = Replay(0);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].topic, "kv@node@a");
  EXPECT_EQ(all[0].seq, 2);
  EXPECT_EQ(all[1].seq, 3);
  EXPECT_EQ(all[2].topic, "kv@node@b");
  std::vector<Batch> only_a = Replay(3, "kv@node@a", /*with_topic=*/true);
  ASSERT_EQ(only_a.size(), 1u);
  EXPECT_EQ(only_a[0].seq, 3);
  EXPECT_EQ(only_a[0].hashes[0], (std::vector<uint64_t>{4}));
  EXPECT_TRUE(Replay(100).empty());
  EXPECT_EQ(publisher_->stats().replay_requests, 3);
}

TEST_F(PublisherTest, AMalformedReplayRequestIsNotAnswered) {
  ASSERT_NO_FATAL_FAILURE(Start(Options()));
  Event("a", TierEvent::Kind::kStored, {1});
  publisher_->Flush();
  zmq::socket_t dealer(ctx_, zmq::socket_type::dealer);
  dealer.connect(publisher_->replay_endpoint());
  // Three bytes of sequence number, then a huge frame count.
  std::array<zmq::const_buffer, 2> bad = {zmq::const_buffer(),
                                          zmq::str_buffer("abc")};
  zmq::send_multipart(dealer, bad);
  std::array<zmq::const_buffer, 6> many = {
      zmq::const_buffer(), zmq::str_buffer("12345678"), zmq::str_buffer("t"),
      zmq::str_buffer("x"), zmq::str_buffer("y"), zmq::str_buffer("z")};
  zmq::send_multipart(dealer, many);
  // A good request on the same socket: its answer is the first to arrive.
  std::array<char, 8> zero = {};
  std::array<zmq::const_buffer, 2> good = {zmq::const_buffer(),
                                           zmq::buffer(zero)};
  zmq::send_multipart(dealer, good);
  std::vector<zmq::message_t> frames;
  ASSERT_TRUE(zmq::recv_multipart(dealer, std::back_inserter(frames)));
  ASSERT_EQ(frames.size(), 4u);
  EXPECT_EQ(frames[1].to_string(), "kv@node@probe");  // The buffer's first.
  EXPECT_EQ(publisher_->stats().replay_refused, 2);
}

TEST_F(PublisherTest, OverflowDropsThenResyncsEveryTopic) {
  std::atomic<bool> paused{false};
  absl::Notification taken, release;
  KvEventPublisherOptions options = Options();
  options.max_queued_events = 4;
  options.before_send = [&paused, &taken, &release] {
    if (!paused.load()) return;
    paused.store(false);
    taken.Notify();
    release.WaitForNotification();
  };
  ASSERT_NO_FATAL_FAILURE(Start(options));
  int resyncs = 0;
  KvEventPublisher* p = publisher_.get();
  publisher_->SetEngineHooks(nullptr, [&resyncs, p] {
    ++resyncs;
    p->OnAllCleared();
    TierEvent e;
    e.ns = "a";
    const std::vector<uint64_t> hashes = {1000};
    const std::vector<int32_t> tokens(4, 1);
    const std::vector<absl::Span<const int32_t>> pieces = {tokens};
    e.block_hashes = hashes;
    e.tokens = pieces;
    p->OnTierEvent(e);
  });
  // The publisher thread takes this one and stops at the gate.
  paused.store(true);
  Event("a", TierEvent::Kind::kStored, {1});
  taken.WaitForNotification();
  // Four wait; the six after them are dropped.
  for (uint64_t h = 10; h < 20; ++h) Event("a", TierEvent::Kind::kStored, {h});
  EXPECT_EQ(publisher_->stats().events_dropped, 6);
  EXPECT_EQ(publisher_->stats().queued_events, 4);
  release.Notify();
  publisher_->Flush();
  // The held event, the four queued, then the resync: a clear and a store.
  std::vector<std::string> types;
  std::vector<uint64_t> last;
  while (types.size() < 8) {
    Batch b = Next();
    types.insert(types.end(), b.types.begin(), b.types.end());
    last = b.hashes.back();
  }
  EXPECT_EQ(types, (std::vector<std::string>{
                       "AllBlocksCleared", "BlockStored", "BlockStored",
                       "BlockStored", "BlockStored", "BlockStored",
                       "AllBlocksCleared", "BlockStored"}));
  EXPECT_EQ(last, (std::vector<uint64_t>{1000}));
  EXPECT_EQ(resyncs, 1);
  EXPECT_EQ(publisher_->stats().resyncs, 1);
}

TEST_F(PublisherTest, DeclaringMovesANamespaceBetweenTopics) {
  ASSERT_NO_FATAL_FAILURE(Start(Options()));
  std::unique_ptr<RadixTree> tree =
      *RadixTree::Create({.page_size = 4, .cp_size = 1});
  ASSERT_TRUE(tree->SetTierListener(publisher_.get(), 4, 0).ok());
  RadixTree* t = tree.get();
  publisher_->SetEngineHooks(
      [t](absl::string_view ns, absl::FunctionRef<void()> between) {
        t->WithdrawAll(ns);
        between();
        t->AnnounceAll(ns);
      },
      nullptr);
  const std::vector<int32_t> key = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE(tree->Insert("a", key, std::vector<LogicalPage>{1, 2}).ok());
  publisher_->Flush();
  Batch stored = Next();
  EXPECT_EQ(stored.topic, "kv@node@a");
  ASSERT_EQ(stored.types.back(), "BlockStored");
  const std::vector<uint64_t> hashes = stored.hashes.back();
  ASSERT_EQ(hashes.size(), 2u);

  ASSERT_TRUE(publisher_->Declare("a", "pod-1", "llama").ok());
  publisher_->Flush();
  Batch removed = Next();
  EXPECT_EQ(removed.topic, "kv@node@a");
  EXPECT_EQ(removed.types, (std::vector<std::string>{"BlockRemoved"}));
  EXPECT_EQ(removed.hashes[0], hashes);
  Batch moved = Next();
  EXPECT_EQ(moved.topic, "kv@pod-1@llama");
  EXPECT_EQ(moved.types,
            (std::vector<std::string>{"AllBlocksCleared", "BlockStored"}));
  EXPECT_EQ(moved.hashes[1], hashes);
  // The same declaration again moves nothing; another namespace cannot
  // take the topic.
  EXPECT_TRUE(publisher_->Declare("a", "pod-1", "llama").ok());
  EXPECT_EQ(publisher_->Declare("b", "pod-1", "llama").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(publisher_->Declare("b", "pod@1", "").code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(tree->SetTierListener(nullptr, 0, 0).ok());
}

TEST(PublisherCreateTest, RefusesBadEndpointsAndSizes) {
  KvEventPublisherOptions options;
  options.topics.instance = "n";
  EXPECT_FALSE(KvEventPublisher::Create(options).ok());  // No endpoint.
  options.endpoint = "bogus://x";
  EXPECT_FALSE(KvEventPublisher::Create(options).ok());
  testing::TempDir dir;
  options.endpoint = "ipc://" + dir.Child("p");
  options.replay_endpoint = "tcp://127.0.0.1:5999";  // Would connect.
  EXPECT_EQ(KvEventPublisher::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.replay_endpoint = "";
  options.max_queued_events = 0;
  EXPECT_FALSE(KvEventPublisher::Create(options).ok());
}

}  // namespace
}  // namespace hicache::events
