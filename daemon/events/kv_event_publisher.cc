#include "daemon/events/kv_event_publisher.h"

#include <array>
#include <iterator>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace hicache::events {
namespace {

std::array<char, 8> BigEndian(int64_t value) {
  std::array<char, 8> out;
  const uint64_t v = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(v >> (56 - 8 * i));
  return out;
}

uint64_t FromBigEndian(const zmq::message_t& frame) {
  uint64_t v = 0;
  const auto* bytes = static_cast<const unsigned char*>(frame.data());
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | bytes[i];
  return v;
}

// vLLM's rule: wildcard, IPv6 wildcard, ipc and inproc endpoints are bound.
bool Binds(const std::string& endpoint) {
  return absl::StrContains(endpoint, "*") || absl::StrContains(endpoint, "::") ||
         absl::StartsWith(endpoint, "ipc://") ||
         absl::StartsWith(endpoint, "inproc://");
}

double NowSeconds() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

}  // namespace

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Create(
    KvEventPublisherOptions options) {
  if (options.endpoint.empty()) {
    return absl::InvalidArgumentError("the KV event endpoint is empty");
  }
  if (options.buffer_batches < 0 || options.hwm < 0 ||
      options.max_queued_events < 1 || options.max_batch_events < 1) {
    return absl::InvalidArgumentError(
        "KV event buffer, high-water mark and queue sizes must be positive");
  }
  if (options.format.block_size == 0) {
    return absl::InvalidArgumentError("the KV event block size is 0");
  }
  if (!options.replay_endpoint.empty() && !Binds(options.replay_endpoint)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the KV event replay endpoint '", options.replay_endpoint,
        "' must be one to bind (a '*' host, ipc:// or inproc://)"));
  }
  absl::StatusOr<KvEventTopics> topics = KvEventTopics::Create(options.topics);
  if (!topics.ok()) return topics.status();
  std::unique_ptr<KvEventPublisher> publisher(
      new KvEventPublisher(std::move(options), *std::move(topics)));
  if (absl::Status s = publisher->Open(); !s.ok()) return s;
  if (publisher->options_.background) {
    publisher->sender_ = std::make_unique<BackgroundWorker>("KV events");
  }
  publisher->publisher_ = std::thread([p = publisher.get()] {
    p->PublishLoop();
  });
  if (publisher->replay_ != nullptr) {
    publisher->replayer_ = std::thread([p = publisher.get()] {
      p->ReplayLoop();
    });
  }
  return publisher;
}

KvEventPublisher::KvEventPublisher(KvEventPublisherOptions options,
                                   KvEventTopics topics)
    : options_(std::move(options)),
      encoder_(options_.format),
      topics_(std::move(topics)) {}

absl::Status KvEventPublisher::Open() {
  try {
    context_ = std::make_unique<zmq::context_t>(1);
    pub_ = std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::pub);
    pub_->set(zmq::sockopt::sndhwm, static_cast<int>(options_.hwm));
    pub_->set(zmq::sockopt::linger, 0);
    if (Binds(options_.endpoint)) {
      pub_->bind(options_.endpoint);
      endpoint_ = pub_->get(zmq::sockopt::last_endpoint);
    } else {
      pub_->connect(options_.endpoint);
      endpoint_ = options_.endpoint;
    }
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat(
        "KV event endpoint '", options_.endpoint, "': ", e.what()));
  }
  if (options_.replay_endpoint.empty()) return absl::OkStatus();
  try {
    replay_ =
        std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::router);
    // A whole replay and its end marker fit (vLLM's 2 * (buffer + 1)).
    replay_->set(zmq::sockopt::sndhwm,
                 static_cast<int>(2 * (options_.buffer_batches + 1)));
    replay_->set(zmq::sockopt::linger, 0);
    replay_->bind(options_.replay_endpoint);
    replay_endpoint_ = replay_->get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat("KV event replay endpoint '",
                                               options_.replay_endpoint,
                                               "': ", e.what()));
  }
  return absl::OkStatus();
}

KvEventPublisher::~KvEventPublisher() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    work_cv_.SignalAll();
  }
  if (publisher_.joinable()) publisher_.join();
  // Wakes the replay thread's blocking receive (ETERM).
  if (context_ != nullptr) context_->shutdown();
  if (replayer_.joinable()) replayer_.join();
  pub_.reset();
  replay_.reset();
  context_.reset();
}

void KvEventPublisher::SetEngineHooks(Reannounce reannounce, Resync resync) {
  MutexLock lock(&mu_);
  reannounce_ = std::move(reannounce);
  resync_ = std::move(resync);
}

std::string KvEventPublisher::TopicOf(absl::string_view ns) {
  MutexLock lock(&mu_);
  return topics_.TopicOf(ns);
}

absl::Status KvEventPublisher::Declare(absl::string_view ns,
                                       absl::string_view instance,
                                       absl::string_view model) {
  for (auto [field, value] : {std::pair{"event_instance", instance},
                              std::pair{"event_model", model}}) {
    if (value.empty()) continue;
    if (absl::Status s = KvEventTopics::ValidateName(field, value); !s.ok()) {
      return s;
    }
  }
  Reannounce reannounce;
  std::string topic;
  {
    MutexLock lock(&mu_);
    absl::StatusOr<std::string> declared =
        topics_.Declared(ns, instance, model);
    if (!declared.ok()) return declared.status();
    if (*declared == topics_.TopicOf(ns)) return absl::OkStatus();
    topic = *std::move(declared);
    reannounce = reannounce_;
  }
  auto move = [&] {
    MutexLock lock(&mu_);
    // Checked again: another declaration may have taken it meanwhile.
    if (topics_.Declared(ns, instance, model).ok()) {
      spdlog::info("KV events of namespace '{}' move from topic '{}' to '{}'",
                   std::string(ns), topics_.TopicOf(ns), topic);
      topics_.Assign(ns, topic);
    }
  };
  if (reannounce) {
    reannounce(ns, move);
  } else {
    move();
  }
  MutexLock lock(&mu_);
  if (topics_.TopicOf(ns) != topic) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV event topic '", topic, "' was taken by another namespace"));
  }
  return absl::OkStatus();
}

bool KvEventPublisher::EnqueueLocked(KvEvent event, const TierEvent* tier,
                                     bool bounded) {
  if (bounded && static_cast<int64_t>(queue_.size()) >=
                     options_.max_queued_events) {
    ++stats_.events_dropped;
    if (!overflowed_) {
      overflowed_ = true;
      work_cv_.Signal();
    }
    return false;
  }
  if (!started_topics_.contains(event.topic)) {
    // A topic's first batch clears what an earlier daemon announced there.
    started_topics_.insert(event.topic);
    QueueClearLocked(event.topic);
  }
  Queued& queued = queue_.emplace_back();
  queued.event = std::move(event);
  queued.ts = Now();
  if (tier != nullptr) {
    queued.hashes_at = queue_hashes_.size();
    queued.hashes = tier->block_hashes.size();
    queue_hashes_.insert(queue_hashes_.end(), tier->block_hashes.begin(),
                         tier->block_hashes.end());
    queued.tokens_at = queue_tokens_.size();
    for (absl::Span<const int32_t> piece : tier->tokens) {
      queue_tokens_.insert(queue_tokens_.end(), piece.begin(), piece.end());
    }
    queued.tokens = queue_tokens_.size() - queued.tokens_at;
  }
  ++queued_ever_;
  // A wake-up only for a waiting thread: a futex call per event would cost
  // more than the event.
  if (publisher_waiting_) work_cv_.Signal();
  return true;
}

double KvEventPublisher::Now() const {
  return options_.now ? options_.now() : NowSeconds();
}

void KvEventPublisher::QueueClearLocked(const std::string& topic) {
  Queued& queued = queue_.emplace_back();
  queued.event.kind = KvEvent::Kind::kAllCleared;
  queued.event.topic = topic;
  queued.ts = Now();
  ++queued_ever_;
}

void KvEventPublisher::OnTierEvent(const TierEvent& event) {
  KvEvent out;
  out.kind = event.kind == TierEvent::Kind::kStored ? KvEvent::Kind::kStored
                                                    : KvEvent::Kind::kRemoved;
  out.tier = event.tier;
  out.has_parent = event.has_parent;
  out.parent_hash = event.parent_hash;
  MutexLock lock(&mu_);
  out.topic = topics_.TopicOf(event.ns);
  // After a drop nothing more is queued until the resync (which starts with
  // a clear): what follows a gap would be wrong anyway.
  if (overflowed_) {
    ++stats_.events_dropped;
    return;
  }
  EnqueueLocked(std::move(out), &event, /*bounded=*/true);
}

void KvEventPublisher::OnAllCleared() {
  MutexLock lock(&mu_);
  overflowed_ = false;
  for (const std::string& topic : started_topics_) QueueClearLocked(topic);
  work_cv_.Signal();
}

void KvEventPublisher::Flush() {
  MutexLock lock(&mu_);
  const int64_t target = queued_ever_;
  while (sent_ever_ < target && !stop_) sent_cv_.Wait(&mu_);
}

KvEventPublisherStats KvEventPublisher::stats() const {
  KvEventPublisherStats out;
  {
    MutexLock lock(&mu_);
    out = stats_;
    out.queued_events = static_cast<int64_t>(queue_.size());
  }
  MutexLock lock(&buffer_mu_);
  out.replay_requests = replay_requests_;
  out.replay_batches = replay_batches_;
  out.replay_refused = replay_refused_;
  return out;
}

void KvEventPublisher::PublishLoop() {
  std::vector<Queued> taken;
  std::vector<uint64_t> taken_hashes;
  std::vector<int32_t> taken_tokens;
  while (true) {
    bool resync = false;
    Resync resync_fn;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stop_ && !(overflowed_ && resync_)) {
        publisher_waiting_ = true;
        work_cv_.Wait(&mu_);
        publisher_waiting_ = false;
      }
      if (queue_.empty() && stop_) return;
      taken.swap(queue_);
      taken_hashes.swap(queue_hashes_);
      taken_tokens.swap(queue_tokens_);
      resync = overflowed_ && resync_ != nullptr;
      resync_fn = resync_;
    }
    for (Queued& q : taken) {
      q.event.block_hashes =
          absl::MakeConstSpan(taken_hashes).subspan(q.hashes_at, q.hashes);
      q.event.token_ids =
          absl::MakeConstSpan(taken_tokens).subspan(q.tokens_at, q.tokens);
    }
    if (options_.before_send) options_.before_send();
    KvEventPublisherStats tally;
    auto send_all = [&] {
      size_t begin = 0;
      while (begin < taken.size()) {
        size_t end = begin + 1;
        while (end < taken.size() &&
               end - begin < static_cast<size_t>(options_.max_batch_events) &&
               taken[end].event.topic == taken[begin].event.topic) {
          ++end;
        }
        Send(taken[begin].event.topic,
             absl::MakeConstSpan(taken).subspan(begin, end - begin), &tally);
        begin = end;
      }
    };
    if (sender_ != nullptr) {
      sender_->Run(send_all);
    } else {
      send_all();
    }
    {
      MutexLock lock(&mu_);
      stats_.events_published += tally.events_published;
      stats_.blocks_published += tally.blocks_published;
      stats_.batches_published += tally.batches_published;
      sent_ever_ += static_cast<int64_t>(taken.size());
      sent_cv_.SignalAll();
    }
    taken.clear();
    taken_hashes.clear();
    taken_tokens.clear();
    if (resync) {
      // Clears every topic and announces the tree again (under the engine's
      // lock); the events arrive through OnAllCleared and OnTierEvent.
      {
        MutexLock lock(&mu_);
        ++stats_.resyncs;
      }
      resync_fn();
    }
  }
}

void KvEventPublisher::Send(const std::string& topic,
                            absl::Span<const Queued> run,
                            KvEventPublisherStats* tally) {
  std::vector<const KvEvent*> events;
  events.reserve(run.size());
  int64_t blocks = 0;
  for (const Queued& q : run) {
    events.push_back(&q.event);
    blocks += static_cast<int64_t>(q.event.block_hashes.size());
  }
  auto payload = std::make_shared<std::string>();
  encoder_.EncodeBatch(run.front().ts, events, payload.get());
  const uint64_t seq = next_seq_[topic]++;
  const std::array<char, 8> seq_bytes = BigEndian(static_cast<int64_t>(seq));
  try {
    // A PUB socket never blocks: past the high-water mark ZMQ drops. The
    // payload is not copied: ZMQ holds a reference until it is sent.
    pub_->send(zmq::buffer(topic),
               zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    pub_->send(zmq::buffer(seq_bytes),
               zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    auto* hold = new std::shared_ptr<const std::string>(payload);
    zmq::message_t body(
        const_cast<char*>((*hold)->data()), (*hold)->size(),
        [](void*, void* hint) {
          delete static_cast<std::shared_ptr<const std::string>*>(hint);
        },
        hold);
    pub_->send(body, zmq::send_flags::dontwait);
  } catch (const zmq::error_t& e) {
    spdlog::warn("KV events: sending a batch on '{}' failed: {}", topic,
                 e.what());
  }
  tally->events_published += static_cast<int64_t>(run.size());
  tally->blocks_published += blocks;
  ++tally->batches_published;
  if (replay_ == nullptr || options_.buffer_batches == 0) return;
  MutexLock lock(&buffer_mu_);
  buffer_.push_back({topic, seq, std::move(payload)});
  while (static_cast<int64_t>(buffer_.size()) > options_.buffer_batches) {
    buffer_.pop_front();
  }
}

void KvEventPublisher::ReplayLoop() {
  static constexpr std::array<char, 8> kEndSeq = {
      '\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\xff', '\xff'};
  std::vector<zmq::message_t> request;
  std::vector<Buffered> answer;
  while (true) {
    request.clear();
    try {
      if (!zmq::recv_multipart(*replay_, std::back_inserter(request))) {
        continue;
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;  // Shutting down.
      spdlog::warn("KV event replay: receive failed: {}", e.what());
      continue;
    }
    // [identity, "", start_seq] (vLLM's), optionally [.., topic].
    const bool valid = (request.size() == 3 || request.size() == 4) &&
                       request[1].size() == 0 && request[2].size() == 8;
    if (!valid) {
      MutexLock lock(&buffer_mu_);
      ++replay_refused_;
      continue;
    }
    const uint64_t start = FromBigEndian(request[2]);
    const bool filtered = request.size() == 4;
    const std::string topic =
        filtered ? request[3].to_string() : std::string();
    answer.clear();
    {
      MutexLock lock(&buffer_mu_);
      for (const Buffered& b : buffer_) {
        if (b.seq >= start && (!filtered || b.topic == topic)) {
          answer.push_back(b);
        }
      }
      ++replay_requests_;
      replay_batches_ += static_cast<int64_t>(answer.size());
    }
    try {
      const zmq::const_buffer identity(request[0].data(), request[0].size());
      for (const Buffered& b : answer) {
        const std::array<char, 8> seq = BigEndian(static_cast<int64_t>(b.seq));
        std::array<zmq::const_buffer, 5> frames = {
            identity, zmq::const_buffer(), zmq::buffer(b.topic),
            zmq::buffer(seq),
            zmq::buffer(b.payload->data(), b.payload->size())};
        zmq::send_multipart(*replay_, frames);
      }
      std::array<zmq::const_buffer, 5> end = {
          identity, zmq::const_buffer(), zmq::const_buffer(),
          zmq::buffer(kEndSeq), zmq::const_buffer()};
      zmq::send_multipart(*replay_, end);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      spdlog::warn("KV event replay: answering failed: {}", e.what());
    }
  }
}

}  // namespace hicache::events
