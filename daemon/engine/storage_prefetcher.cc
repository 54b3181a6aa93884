#include "daemon/engine/storage_prefetcher.h"

#include <xxhash.h>

#include <utility>

namespace hicache {
namespace {

constexpr size_t kKeptResults = 1024;

uint64_t Fingerprint(absl::string_view ns, absl::Span<const int32_t> tokens) {
  const uint64_t seed = XXH3_64bits(ns.data(), ns.size());
  return XXH3_64bits_withSeed(tokens.data(), tokens.size() * sizeof(int32_t),
                              seed);
}

}  // namespace

StoragePrefetcher::StoragePrefetcher(Promote promote, int max_queued)
    : promote_(std::move(promote)), max_queued_(max_queued) {
  thread_ = std::thread([this] { Loop(); });
}

StoragePrefetcher::~StoragePrefetcher() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    queue_.clear();
    cv_.SignalAll();
  }
  thread_.join();
}

uint64_t StoragePrefetcher::Start(absl::string_view ns,
                                  absl::Span<const int32_t> tokens) {
  const uint64_t fingerprint = Fingerprint(ns, tokens);
  MutexLock lock(&mu_);
  if (auto it = pending_.find(fingerprint); it != pending_.end()) {
    ++stats_.deduplicated;
    return it->second;
  }
  if (stop_ || static_cast<int>(queue_.size()) >= max_queued_) {
    ++stats_.dropped;
    return 0;
  }
  const uint64_t id = next_id_++;
  pending_[fingerprint] = id;
  queue_.push_back(Job{id, fingerprint, std::string(ns),
                       std::vector<int32_t>(tokens.begin(), tokens.end())});
  ++stats_.started;
  cv_.SignalAll();
  return id;
}

std::optional<int64_t> StoragePrefetcher::Wait(uint64_t id,
                                               absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  MutexLock lock(&mu_);
  while (true) {
    if (auto it = finished_.find(id); it != finished_.end()) return it->second;
    bool pending = false;
    for (const auto& [fp, pending_id] : pending_) pending |= pending_id == id;
    if (!pending || stop_) return std::nullopt;
    if (timeout == absl::InfiniteDuration()) {
      cv_.Wait(&mu_);
      continue;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration() || cv_.WaitWithTimeout(&mu_, left)) {
      if (auto it = finished_.find(id); it != finished_.end()) {
        return it->second;
      }
      ++stats_.waits_timed_out;
      return std::nullopt;
    }
  }
}

void StoragePrefetcher::Loop() {
  while (true) {
    Job job;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stop_) cv_.Wait(&mu_);
      if (stop_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    const int64_t promoted = promote_(job.ns, job.tokens);
    MutexLock lock(&mu_);
    running_ = false;
    pending_.erase(job.fingerprint);
    finished_[job.id] = promoted;
    while (finished_.size() > kKeptResults) finished_.erase(finished_.begin());
    ++stats_.completed;
    cv_.SignalAll();
  }
}

void StoragePrefetcher::WaitIdle() {
  MutexLock lock(&mu_);
  while ((!queue_.empty() || running_) && !stop_) cv_.Wait(&mu_);
}

StoragePrefetcher::Stats StoragePrefetcher::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace hicache
