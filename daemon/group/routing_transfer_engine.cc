#include "daemon/group/routing_transfer_engine.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "daemon/core/log_format.h"
#include "spdlog/spdlog.h"

namespace hicache::group {

RoutingTransferEngine::RoutingTransferEngine(
    TransferListener* listener, std::unique_ptr<TransferEngine> local,
    std::vector<Rank> local_ranks)
    : listener_(listener),
      local_(std::move(local)),
      local_ranks_(std::move(local_ranks)),
      completer_([listener](StepDone done) {
        listener->OnStepDone(std::move(done));
      }) {
  MutexLock lock(&mu_);
  for (Rank rank : local_ranks_) routes_[rank] = local_;
}

RoutingTransferEngine::~RoutingTransferEngine() { completer_.Drain(); }

absl::Status RoutingTransferEngine::SetRoute(
    const std::vector<Rank>& ranks, std::shared_ptr<TransferEngine> engine) {
  if (engine == nullptr) {
    return absl::InvalidArgumentError("no engine to route to");
  }
  for (Rank rank : ranks) {
    if (std::find(local_ranks_.begin(), local_ranks_.end(), rank) !=
        local_ranks_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " is served locally"));
    }
  }
  MutexLock lock(&mu_);
  for (Rank rank : ranks) routes_[rank] = engine;
  return absl::OkStatus();
}

void RoutingTransferEngine::ClearRoute(const std::vector<Rank>& ranks) {
  MutexLock lock(&mu_);
  for (Rank rank : ranks) {
    if (std::find(local_ranks_.begin(), local_ranks_.end(), rank) ==
        local_ranks_.end()) {
      routes_.erase(rank);
    }
  }
}

int64_t RoutingTransferEngine::unrouted_steps() const {
  MutexLock lock(&mu_);
  return unrouted_steps_;
}

std::shared_ptr<TransferEngine> RoutingTransferEngine::RouteLocked(
    Rank rank) const {
  auto it = routes_.find(rank);
  return it == routes_.end() ? nullptr : it->second;
}

absl::Status RoutingTransferEngine::Submit(TransferTask task) {
  // Split by engine, translating fences; refuse before anything is queued.
  struct Part {
    std::shared_ptr<TransferEngine> engine;
    TransferTask task;
  };
  std::vector<Part> parts;
  std::vector<StepDone> unrouted;
  {
    MutexLock lock(&mu_);
    absl::flat_hash_set<Rank> seen;
    for (RankCopy& copy : task.ranks) {
      if (!seen.insert(copy.rank).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", copy.rank, " is named twice"));
      }
      std::shared_ptr<TransferEngine> engine = RouteLocked(copy.rank);
      if (copy.wait_fence != 0) {
        auto f = fences_.find(copy.wait_fence);
        if (f == fences_.end() || f->second.rank != copy.rank ||
            f->second.engine != engine) {
          return absl::InvalidArgumentError(
              absl::StrCat("rank ", copy.rank, ": fence ", copy.wait_fence,
                           " is not registered for it"));
        }
        copy.wait_fence = f->second.inner;
      }
      if (engine == nullptr) {
        unrouted.push_back(FailedStep(
            task, copy.rank,
            absl::UnavailableError(absl::StrCat(
                "rank ", copy.rank,
                " is served by no live member of the CP group"))));
        continue;
      }
      auto part = std::find_if(parts.begin(), parts.end(), [&](const Part& p) {
        return p.engine == engine;
      });
      if (part == parts.end()) {
        parts.push_back(Part{engine, TransferTask{.op_id = task.op_id,
                                                  .direction = task.direction,
                                                  .step = task.step}});
        part = parts.end() - 1;
      }
      part->task.ranks.push_back(std::move(copy));
    }
  }
  // The local part first: the backend validates fully, and a refusal of the
  // first part still refuses the whole task (nothing is queued yet).
  std::stable_partition(parts.begin(), parts.end(),
                        [&](const Part& p) { return p.engine == local_; });
  for (size_t i = 0; i < parts.size(); ++i) {
    const size_t ranks = parts[i].task.ranks.size();
    std::vector<Rank> names;
    for (const RankCopy& copy : parts[i].task.ranks) names.push_back(copy.rank);
    absl::Status submitted = parts[i].engine->Submit(std::move(parts[i].task));
    if (submitted.ok()) continue;
    if (i == 0) return submitted;  // Nothing is queued yet.
    // Something is queued already: this part's ranks fail, once each.
    spdlog::error("CP group: routing op {} step {}: {} ranks refused: {}",
                  task.op_id, task.step, ranks, submitted);
    for (Rank rank : names) {
      unrouted.push_back(FailedStep(task, rank, CopyStatus(submitted)));
    }
  }
  if (!unrouted.empty()) {
    MutexLock lock(&mu_);
    unrouted_steps_ += static_cast<int64_t>(unrouted.size());
    completer_.Complete(std::move(unrouted));
  }
  return absl::OkStatus();
}

void RoutingTransferEngine::Drain() {
  std::vector<std::shared_ptr<TransferEngine>> engines;
  {
    MutexLock lock(&mu_);
    for (const auto& [rank, engine] : routes_) {
      if (std::find(engines.begin(), engines.end(), engine) == engines.end()) {
        engines.push_back(engine);
      }
    }
  }
  if (std::find(engines.begin(), engines.end(), local_) == engines.end()) {
    engines.push_back(local_);
  }
  for (const auto& engine : engines) engine->Drain();
  completer_.Drain();
}

absl::StatusOr<uint64_t> RoutingTransferEngine::RegisterFence(
    Rank rank, const std::string& handle) {
  std::shared_ptr<TransferEngine> engine;
  {
    MutexLock lock(&mu_);
    engine = RouteLocked(rank);
  }
  if (engine == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is served by no live member"));
  }
  absl::StatusOr<uint64_t> inner = engine->RegisterFence(rank, handle);
  if (!inner.ok()) return inner.status();
  MutexLock lock(&mu_);
  const uint64_t id = next_fence_++;
  fences_[id] = Fence{rank, std::move(engine), *inner};
  return id;
}

absl::Status RoutingTransferEngine::ReleaseFence(uint64_t fence) {
  Fence found;
  {
    MutexLock lock(&mu_);
    auto it = fences_.find(fence);
    if (it == fences_.end()) {
      return absl::NotFoundError(absl::StrCat("no fence ", fence));
    }
    found = std::move(it->second);
    fences_.erase(it);
  }
  return found.engine->ReleaseFence(found.inner);
}

absl::StatusOr<Rank> RoutingTransferEngine::FenceRank(uint64_t fence) const {
  MutexLock lock(&mu_);
  auto it = fences_.find(fence);
  if (it == fences_.end()) {
    return absl::NotFoundError(absl::StrCat("no fence ", fence));
  }
  return it->second.rank;
}

}  // namespace hicache::group
