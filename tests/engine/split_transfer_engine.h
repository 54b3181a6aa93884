#pragma once

// A transfer decorator for tests of an engine that holds pools for only
// some of the ranks it serves (a CP group's leader, docs/cp-groups.md):
// copies of the local ranks go to the backend's engine; the others "run
// elsewhere" and complete (OK, or with a given error) from this engine's
// own thread (never from inside Submit, as a real link's would), unless
// held, in which case they wait for Release. Install it through EngineOptions::wrap_transfer.

#include <algorithm>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/core/mutex.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache::testing {

class SplitTransferEngine : public TransferEngine {
 public:
  // Remote steps complete with `remote_status` (OK: the copy was done
  // elsewhere; an error: the member that owns the rank is gone).
  SplitTransferEngine(TransferListener* listener,
                      const TransferEngineFactory& backend,
                      std::vector<Rank> local,
                      absl::Status remote_status = absl::OkStatus())
      : listener_(listener),
        local_ranks_(std::move(local)),
        remote_status_(std::move(remote_status)),
        local_(backend(listener)),
        thread_([this] { Run(); }) {}
  ~SplitTransferEngine() override {
    {
      MutexLock lock(&mu_);
      stop_ = true;
      held_ = false;
    }
    cv_.SignalAll();
    thread_.join();
  }

  absl::Status Submit(TransferTask task) override {
    TransferTask local = task;
    local.ranks.clear();
    std::vector<StepDone> remote;
    for (RankCopy& copy : task.ranks) {
      if (std::find(local_ranks_.begin(), local_ranks_.end(), copy.rank) !=
          local_ranks_.end()) {
        local.ranks.push_back(std::move(copy));
      } else {
        remote.push_back(StepDone{.op_id = task.op_id,
                                  .direction = task.direction,
                                  .rank = copy.rank,
                                  .step = task.step,
                                  .status = remote_status_});
      }
    }
    if (!local.ranks.empty()) {
      if (absl::Status s = local_->Submit(std::move(local)); !s.ok()) return s;
    }
    MutexLock lock(&mu_);
    for (StepDone& done : remote) {
      ++remote_steps_;
      queue_.push_back(std::move(done));
    }
    cv_.Signal();
    queued_cv_.SignalAll();
    return absl::OkStatus();
  }
  void Drain() override {
    local_->Drain();
    MutexLock lock(&mu_);
    while ((!queue_.empty() && !held_) || delivering_) idle_cv_.Wait(&mu_);
  }
  absl::StatusOr<uint64_t> RegisterFence(Rank rank,
                                         const std::string& handle) override {
    return local_->RegisterFence(rank, handle);
  }
  absl::Status ReleaseFence(uint64_t fence) override {
    return local_->ReleaseFence(fence);
  }
  absl::StatusOr<Rank> FenceRank(uint64_t fence) const override {
    return local_->FenceRank(fence);
  }
  // Remote completions wait from now on until Release.
  void Hold() {
    MutexLock lock(&mu_);
    held_ = true;
  }
  void Release() {
    {
      MutexLock lock(&mu_);
      held_ = false;
    }
    cv_.SignalAll();
  }
  // Waits until `n` remote completions are queued (held).
  void AwaitQueued(size_t n) {
    MutexLock lock(&mu_);
    while (queue_.size() < n) queued_cv_.Wait(&mu_);
  }
  int remote_steps() {
    MutexLock lock(&mu_);
    return remote_steps_;
  }

 private:
  void Run() {
    MutexLock lock(&mu_);
    while (true) {
      while ((queue_.empty() || held_) && !stop_) cv_.Wait(&mu_);
      if (stop_) return;  // What is still queued is never delivered.
      StepDone done = std::move(queue_.front());
      queue_.pop_front();
      delivering_ = true;
      mu_.Unlock();
      listener_->OnStepDone(std::move(done));
      mu_.Lock();
      delivering_ = false;
      if (queue_.empty()) idle_cv_.SignalAll();
    }
  }

  TransferListener* const listener_;
  const std::vector<Rank> local_ranks_;
  const absl::Status remote_status_;
  std::unique_ptr<TransferEngine> local_;
  Mutex mu_;
  CondVar cv_;
  CondVar idle_cv_;
  CondVar queued_cv_;
  std::deque<StepDone> queue_ ABSL_GUARDED_BY(mu_);
  bool delivering_ ABSL_GUARDED_BY(mu_) = false;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int remote_steps_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace hicache::testing
