#pragma once

// Test doubles for daemon/group tests: a listener that records every
// completion (and the thread it came on), and a transfer engine that moves
// nothing but acks each rank copy from its own thread, in FIFO order, and
// can hold its completions back. std::mutex / std::condition_variable only
// (Debian's Abseil is not TSan-instrumented).

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache::group::testing {

using Site = std::tuple<uint64_t, int, Rank, uint32_t>;  // op, dir, rank, step

inline Site SiteOf(const StepDone& d) {
  return {d.op_id, static_cast<int>(d.direction), d.rank, d.step};
}

// Records completions; Wait* block with a generous deadline (a hang fails
// the test instead of timing it out).
class RecordingListener final : public TransferListener {
 public:
  void OnStepDone(StepDone done) override {
    std::lock_guard<std::mutex> lock(mu_);
    threads_.push_back(std::this_thread::get_id());
    dones_.push_back(std::move(done));
    cv_.notify_all();
  }
  bool WaitFor(size_t n, std::chrono::seconds timeout =
                             std::chrono::seconds(30)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return dones_.size() >= n; });
  }
  std::vector<StepDone> dones() const {
    std::lock_guard<std::mutex> lock(mu_);
    return dones_;
  }
  size_t count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return dones_.size();
  }
  // Completions per site (each must be 1).
  std::map<Site, int> PerSite() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<Site, int> out;
    for (const StepDone& d : dones_) ++out[SiteOf(d)];
    return out;
  }
  bool CalledOn(std::thread::id id) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::thread::id t : threads_) {
      if (t == id) return true;
    }
    return false;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<StepDone> dones_;
  std::vector<std::thread::id> threads_;
};

// Moves nothing: acks every rank copy with 10 bytes a page, OK, from one
// worker thread in submission order. Steps >= `refuse_from` (99) are refused
// (INVALID_ARGUMENT, nothing queued). Hold() keeps completions back until Release(). Fences get
// ids of its own, from 1.
class FakeEngine final : public TransferEngine {
 public:
  explicit FakeEngine(TransferListener* listener, uint32_t refuse_from = 99)
      : listener_(listener),
        refuse_from_(refuse_from),
        worker_([this] { Loop(); }) {}
  ~FakeEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      held_ = false;
      cv_.notify_all();
    }
    worker_.join();
  }

  absl::Status Submit(TransferTask task) override {
    if (task.step >= refuse_from_) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", task.step, " refused by the fake"));
    }
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(task);
    for (const RankCopy& copy : task.ranks) {
      queue_.push_back(StepDone{
          .op_id = task.op_id,
          .direction = task.direction,
          .rank = copy.rank,
          .step = task.step,
          .status = absl::OkStatus(),
          .bytes = 10 * static_cast<uint64_t>(copy.device_pages.size())});
      ++in_flight_;
    }
    cv_.notify_all();
    return absl::OkStatus();
  }
  void Drain() override {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return in_flight_ == 0; });
  }
  absl::StatusOr<uint64_t> RegisterFence(Rank rank,
                                         const std::string& handle) override {
    if (handle == "bad") return absl::InvalidArgumentError("bad handle");
    std::lock_guard<std::mutex> lock(mu_);
    fences_[next_fence_] = rank;
    return next_fence_++;
  }
  absl::Status ReleaseFence(uint64_t fence) override {
    std::lock_guard<std::mutex> lock(mu_);
    return fences_.erase(fence) == 1
               ? absl::OkStatus()
               : absl::NotFoundError(absl::StrCat("no fence ", fence));
  }
  absl::StatusOr<Rank> FenceRank(uint64_t fence) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fences_.find(fence);
    if (it == fences_.end()) return absl::NotFoundError("no fence");
    return it->second;
  }

  void Hold() {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = true;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = false;
    cv_.notify_all();
  }
  // Releases `n` held completions (in order), then holds again.
  void ReleaseSome(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    release_budget_ += n;
    cv_.notify_all();
  }
  // Waits until `n` completions were handed to the listener.
  bool WaitDelivered(int64_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return idle_cv_.wait_for(lock, std::chrono::seconds(30),
                             [&] { return delivered_ >= n; });
  }
  std::vector<TransferTask> tasks() const {
    std::lock_guard<std::mutex> lock(mu_);
    return tasks_;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] {
        return stopping_ ||
               (!queue_.empty() && (!held_ || release_budget_ > 0));
      });
      if (queue_.empty()) {
        if (stopping_) return;
        continue;
      }
      if (held_) --release_budget_;
      StepDone done = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      listener_->OnStepDone(std::move(done));
      lock.lock();
      ++delivered_;
      --in_flight_;
      idle_cv_.notify_all();
    }
  }

  TransferListener* const listener_;
  const uint32_t refuse_from_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<StepDone> queue_;
  std::vector<TransferTask> tasks_;
  std::map<uint64_t, Rank> fences_;
  uint64_t next_fence_ = 1;
  int64_t in_flight_ = 0;
  int64_t delivered_ = 0;
  int release_budget_ = 0;
  bool held_ = false;
  bool stopping_ = false;
  std::thread worker_;
};

// A task of `pages` page pairs on each of `ranks`.
inline TransferTask MakeTask(uint64_t op, uint32_t step,
                             std::vector<Rank> ranks, int pages = 4,
                             TransferDirection direction =
                                 TransferDirection::kDeviceToHost) {
  TransferTask task{.op_id = op, .direction = direction, .step = step};
  for (Rank rank : ranks) {
    RankCopy copy{.rank = rank};
    for (int i = 0; i < pages; ++i) {
      copy.device_pages.push_back(1 + i);
      copy.host_pages.push_back(2 + i);
    }
    task.ranks.push_back(std::move(copy));
  }
  return task;
}

}  // namespace hicache::group::testing
