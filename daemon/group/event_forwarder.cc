#include "daemon/group/event_forwarder.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/core/log_format.h"
#include "spdlog/spdlog.h"

namespace hicache::group {
namespace {

bool PerRank(OpEvent::Type type) {
  return type == OpEvent::Type::kBackupStep ||
         type == OpEvent::Type::kLoadStep;
}

}  // namespace

EventForwarder::EventForwarder(EventForwarderOptions options)
    : options_(options), thread_([this] { Run(); }) {}

EventForwarder::~EventForwarder() { Stop(); }

WorkerEventRecord EventForwarder::ToRecord(const OpEvent& event,
                                           const std::string& ns) {
  return WorkerEventRecord{.op = event.op,
                           .kind = static_cast<WorkerEventKind>(event.type),
                           .rank = event.rank,
                           .step = event.step,
                           .ok = event.ok,
                           .fence = event.fence,
                           .ns = ns};
}

void EventForwarder::Publish(const OpEvent& event, const std::string& ns) {
  MutexLock lock(&mu_);
  if (stopping_) return;
  ++stats_.events_published;
  const bool per_rank = PerRank(event.type);
  bool queued = false;
  for (auto& [id, sink] : sinks_) {
    if (sink.failed) continue;
    if (per_rank && std::find(sink.ranks.begin(), sink.ranks.end(),
                              event.rank) == sink.ranks.end()) {
      continue;
    }
    if (sink.queue.size() >= options_.max_queued_events) {
      sink.failed = true;
      sink.queue.clear();
      sink.failure = absl::ResourceExhaustedError(absl::StrCat(
          "CP group: ", options_.max_queued_events,
          " worker events wait for ", sink.name,
          ", which does not take them fast enough"));
      sink.fail_pending = true;
      ++stats_.members_failed;
      queued = true;
      continue;
    }
    sink.queue.push_back(ToRecord(event, ns));
    ++sink.events_queued;
    queued = true;
  }
  if (queued) wake_.SignalAll();
}

absl::StatusOr<uint64_t> EventForwarder::Attach(std::string name,
                                                std::vector<Rank> ranks,
                                                SendFn send, FailFn on_fail) {
  MutexLock lock(&mu_);
  if (stopping_) {
    return absl::FailedPreconditionError("CP group event forwarder stopped");
  }
  const uint64_t id = next_sink_++;
  Sink& sink = sinks_[id];
  sink.name = std::move(name);
  sink.ranks = std::move(ranks);
  sink.send = std::move(send);
  sink.on_fail = std::move(on_fail);
  return id;
}

void EventForwarder::Detach(uint64_t sink) {
  MutexLock lock(&mu_);
  sinks_.erase(sink);
  while (busy_ == sink && sink != 0) idle_.Wait(&mu_);
}

void EventForwarder::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    wake_.SignalAll();
  }
  thread_.join();
  MutexLock lock(&mu_);
  sinks_.clear();
}

EventForwarder::Stats EventForwarder::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

std::optional<EventForwarder::SinkStats> EventForwarder::sink_stats(
    uint64_t sink) const {
  MutexLock lock(&mu_);
  auto it = sinks_.find(sink);
  if (it == sinks_.end()) return std::nullopt;
  const Sink& s = it->second;
  return SinkStats{.events_queued = s.events_queued,
                   .events_sent = s.events_sent,
                   .frames_sent = s.frames_sent,
                   .events_waiting = static_cast<int64_t>(s.queue.size()),
                   .failed = s.failed};
}

void EventForwarder::Run() {
  mu_.Lock();  // Released around each send and on_fail.
  while (true) {
    // The sinks with something to do, in id order.
    std::vector<uint64_t> work;
    while (!stopping_) {
      for (const auto& [id, sink] : sinks_) {
        if (sink.fail_pending || (!sink.failed && !sink.queue.empty())) {
          work.push_back(id);
        }
      }
      if (!work.empty()) break;
      wake_.Wait(&mu_);
    }
    if (stopping_) {
      mu_.Unlock();
      return;
    }
    std::sort(work.begin(), work.end());
    for (uint64_t id : work) {
      auto it = sinks_.find(id);
      if (it == sinks_.end()) continue;  // Detached meanwhile.
      Sink& sink = it->second;
      if (sink.fail_pending) {
        sink.fail_pending = false;
        const absl::Status cause = sink.failure;
        const std::string name = sink.name;
        busy_ = id;
        {
          FailFn on_fail = sink.on_fail;
          mu_.Unlock();
          spdlog::error("CP group: worker events to {} stopped: {}", name,
                        cause);
          if (on_fail) on_fail(cause);
          on_fail = nullptr;  // Before Detach may return.
          mu_.Lock();
        }
        busy_ = 0;
        idle_.SignalAll();
        continue;
      }
      if (sink.failed || sink.queue.empty()) continue;
      WorkerEventBatch batch;
      size_t bytes = 0;
      while (!sink.queue.empty()) {
        const size_t next = EncodedWorkerEventBytes(sink.queue.front());
        if (!batch.events.empty() && bytes + next > options_.max_batch_bytes) {
          break;
        }
        bytes += next;
        batch.events.push_back(std::move(sink.queue.front()));
        sink.queue.pop_front();
      }
      const size_t n = batch.events.size();
      busy_ = id;
      absl::Status sent;
      {
        SendFn send = sink.send;
        mu_.Unlock();
        sent = send ? send(FrameBody(std::move(batch)))
                    : absl::InternalError("no sender");
        send = nullptr;  // Before Detach may return.
        mu_.Lock();
      }
      busy_ = 0;
      idle_.SignalAll();
      it = sinks_.find(id);
      if (sent.ok()) {
        stats_.events_sent += static_cast<int64_t>(n);
        ++stats_.frames_sent;
        if (it != sinks_.end()) {  // Not detached meanwhile.
          it->second.events_sent += static_cast<int64_t>(n);
          ++it->second.frames_sent;
        }
        continue;
      }
      if (it == sinks_.end() || it->second.failed) continue;
      it->second.failed = true;
      it->second.queue.clear();
      it->second.failure = sent;
      it->second.fail_pending = true;
      ++stats_.members_failed;
    }
  }
}

}  // namespace hicache::group
