// The daemon parts //fuzz:service_fuzzer builds each input's engine on: pools
// on the heap (no shared-memory segments per input) and the copy engine
// behind a gate that holds copies in flight.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "daemon/backend/cpu/cpu_transfer_engine.h"
#include "daemon/core/mutex.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/pool/kv_pool.h"

namespace hicache::fuzz {

// Pools on the heap: no shared-memory segments per input.

class HeapPool final : public KvPool {
 public:
  HeapPool(std::string name, uint64_t size)
      : name_(std::move(name)), size_(size), data_(new uint8_t[size]()) {}
  const std::string& name() const override { return name_; }
  uint64_t size_bytes() const override { return size_; }
  void* host_data() const override { return data_.get(); }
  void* backend_data() const override { return data_.get(); }
  PoolExport Export() const override {
    return {PoolExport::Kind::kSharedMemory, name_, size_};
  }

 private:
  const std::string name_;
  const uint64_t size_;
  const std::unique_ptr<uint8_t[]> data_;
};

class HeapPools final : public PoolBackend {
 public:
  absl::StatusOr<std::unique_ptr<KvPool>> CreateDevicePool(
      Rank rank, uint64_t size_bytes) override {
    if (size_bytes == 0) return absl::InvalidArgumentError("size 0");
    return std::make_unique<HeapPool>(absl::StrCat("/fuzz-device-r", rank),
                                      size_bytes);
  }
  absl::StatusOr<std::unique_ptr<KvPool>> CreateHostPool(
      Rank rank, uint64_t size_bytes, bool /*lock_memory*/) override {
    if (size_bytes == 0) return absl::InvalidArgumentError("size 0");
    return std::make_unique<HeapPool>(absl::StrCat("/fuzz-host-r", rank),
                                      size_bytes);
  }
};

// Heap pools and the CPU backend's copy engine: no shared memory per input.
class HeapBackend final : public Backend {
 public:
  std::string name() const override { return "heap"; }
  PoolBackend& pools() override { return pools_; }
  absl::Status CheckCapacity(const RankPools::Sizes&) override {
    return absl::OkStatus();
  }
  std::unique_ptr<TransferEngine> CreateTransferEngine(
      const RankPools* pools, TransferListener* listener) override {
    return std::make_unique<CpuTransferEngine>(pools, listener, 1);
  }

 private:
  HeapPools pools_;
};

// ---------------------------------------------------------------------------
// Copies held in flight. While closed (the Hold op), submitted copy tasks are
// kept instead of reaching the copy engine, so "copies still in flight" is a
// state an input reaches deterministically (with the settle bit, exactly)
// instead of a race with the transfer workers: the clients' calls then meet
// loads and backups whose copies have not landed. Open() passes them on, in
// order; Drain() (the engine's, at its end) opens first. The fuzzer opens it
// before every wait for the copies (Run::Settle).

class GatedTransferEngine final : public TransferEngine {
 public:
  GatedTransferEngine(TransferListener* listener,
                      const TransferEngineFactory& inner)
      : listener_(listener), inner_(inner(listener)) {}

  absl::Status Submit(TransferTask task) override {
    MutexLock lock(&mu_);
    if (closed_) {
      held_.push_back(std::move(task));
      return absl::OkStatus();
    }
    return inner_->Submit(std::move(task));
  }
  void Drain() override {
    Open();
    inner_->Drain();
  }
  absl::StatusOr<uint64_t> RegisterFence(Rank rank,
                                         const std::string& handle) override {
    return inner_->RegisterFence(rank, handle);
  }
  absl::Status ReleaseFence(uint64_t fence) override {
    return inner_->ReleaseFence(fence);
  }
  absl::StatusOr<Rank> FenceRank(uint64_t fence) const override {
    return inner_->FenceRank(fence);
  }

  void Close() {
    MutexLock lock(&mu_);
    closed_ = true;
  }
  // Passes the held copies on. One the copy engine refuses now (it accepted
  // none of them yet) completes as failed, so that the engine's count of
  // steps in flight still comes down.
  void Open() {
    std::vector<TransferTask> held;
    {
      MutexLock lock(&mu_);
      closed_ = false;
      held.swap(held_);
    }
    for (TransferTask& task : held) {
      const TransferTask copy = task;
      if (absl::Status s = inner_->Submit(std::move(task)); !s.ok()) {
        for (const RankCopy& rank : copy.ranks) {
          StepDone done;
          done.op_id = copy.op_id;
          done.direction = copy.direction;
          done.rank = rank.rank;
          done.step = copy.step;
          done.status = s;
          listener_->OnStepDone(std::move(done));
        }
      }
    }
  }
  bool closed() const {
    MutexLock lock(&mu_);
    return closed_;
  }
  size_t held() const {
    MutexLock lock(&mu_);
    return held_.size();
  }

 private:
  TransferListener* const listener_;
  const std::unique_ptr<TransferEngine> inner_;
  mutable Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<TransferTask> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hicache::fuzz
