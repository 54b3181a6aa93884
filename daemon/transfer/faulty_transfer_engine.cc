#include "daemon/transfer/faulty_transfer_engine.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace hicache {
namespace {

uint64_t Mix(uint64_t h, uint64_t v) {
  // SplitMix64 finalizer over h ^ v: stable across builds and platforms.
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A uniform draw in [0, 1) that depends only on the seed and the site.
double Draw(uint64_t seed, const TransferSite& site) {
  uint64_t h = Mix(seed, site.op_id);
  h = Mix(h, static_cast<uint64_t>(site.direction));
  h = Mix(h, static_cast<uint64_t>(site.rank));
  h = Mix(h, site.step);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

}  // namespace

std::string SiteString(const TransferSite& site) {
  return absl::StrCat(
      "op ", site.op_id, " ",
      site.direction == TransferDirection::kDeviceToHost ? "d2h" : "h2d",
      " rank ", site.rank, " step ", site.step);
}

FaultyTransferEngine::FaultyTransferEngine(
    TransferListener* listener, const TransferEngineFactory& make_inner)
    : listener_(listener), inner_(make_inner(this)) {}

FaultyTransferEngine::~FaultyTransferEngine() { inner_.reset(); }

void FaultyTransferEngine::FailAt(const TransferSite& site, Fault fault) {
  FailWhen([site](const TransferSite& s) { return s == site; },
           std::move(fault));
}

void FaultyTransferEngine::FailWhen(Predicate predicate, Fault fault) {
  MutexLock lock(&mu_);
  rules_.push_back(Rule{std::move(predicate), std::move(fault)});
}

void FaultyTransferEngine::SetRandom(RandomFaults random) {
  MutexLock lock(&mu_);
  random_fault_ = Fault{.status = random.status, .times = -1};
  random_ = std::move(random);
}

void FaultyTransferEngine::HoldWhen(Predicate predicate) {
  MutexLock lock(&mu_);
  hold_ = std::move(predicate);
}

void FaultyTransferEngine::Clear() {
  MutexLock lock(&mu_);
  rules_.clear();
  ++rules_generation_;
  random_ = RandomFaults{};
  hold_ = nullptr;
}

int64_t FaultyTransferEngine::injected() const {
  MutexLock lock(&mu_);
  return static_cast<int64_t>(injected_sites_.size());
}

std::vector<TransferSite> FaultyTransferEngine::injected_sites() const {
  MutexLock lock(&mu_);
  return injected_sites_;
}

int64_t FaultyTransferEngine::completions() const {
  MutexLock lock(&mu_);
  return completions_;
}

int64_t FaultyTransferEngine::held() const {
  MutexLock lock(&mu_);
  return static_cast<int64_t>(held_.size());
}

const FaultyTransferEngine::Fault* FaultyTransferEngine::ChooseLocked(
    const TransferSite& site, int* rule) {
  if (rule != nullptr) *rule = -1;
  for (size_t i = 0; i < rules_.size(); ++i) {
    Fault& fault = rules_[i].fault;
    if (fault.times == 0 || !rules_[i].when(site)) continue;
    if (fault.times > 0) --fault.times;
    if (rule != nullptr) *rule = static_cast<int>(i);
    return &fault;
  }
  const double p = site.direction == TransferDirection::kDeviceToHost
                       ? random_.device_to_host
                       : random_.host_to_device;
  if (p > 0 && Draw(random_.seed, site) < p) return &random_fault_;
  return nullptr;
}

absl::Status FaultyTransferEngine::Submit(TransferTask task) {
  std::vector<Choice> chosen;
  uint64_t generation = 0;
  {
    MutexLock lock(&mu_);
    generation = rules_generation_;
    for (RankCopy& copy : task.ranks) {
      const TransferSite site{task.op_id, task.direction, copy.rank,
                              task.step};
      int rule = -1;
      const Fault* fault = ChooseLocked(site, &rule);
      if (fault == nullptr) continue;
      chosen_[site].push_back(fault->status);
      chosen.push_back(Choice{site, rule});
      if (!fault->copy_anyway) {
        copy.device_pages.clear();
        copy.host_pages.clear();
      }
    }
  }
  absl::Status submitted = inner_->Submit(std::move(task));
  if (!submitted.ok() && !chosen.empty()) {
    // Nothing was queued: withdraw this task's choices.
    MutexLock lock(&mu_);
    for (const Choice& choice : chosen) {
      auto it = chosen_.find(choice.site);
      if (it != chosen_.end()) {
        it->second.pop_back();
        if (it->second.empty()) chosen_.erase(it);
      }
      if (choice.rule >= 0 && generation == rules_generation_ &&
          rules_[choice.rule].fault.times >= 0) {
        ++rules_[choice.rule].fault.times;
      }
    }
  }
  return submitted;
}

absl::StatusOr<uint64_t> FaultyTransferEngine::RegisterFence(
    Rank rank, const std::string& handle) {
  return inner_->RegisterFence(rank, handle);
}

absl::Status FaultyTransferEngine::ReleaseFence(uint64_t fence) {
  return inner_->ReleaseFence(fence);
}

absl::StatusOr<Rank> FaultyTransferEngine::FenceRank(uint64_t fence) const {
  return inner_->FenceRank(fence);
}

void FaultyTransferEngine::Drain() {
  inner_->Drain();
  std::vector<Completion> held;
  {
    MutexLock lock(&mu_);
    held.swap(held_);
  }
  for (const Completion& c : held) Forward(c);
}

int64_t FaultyTransferEngine::ReleaseHeld() {
  std::vector<Completion> held;
  {
    MutexLock lock(&mu_);
    held.swap(held_);
  }
  for (const Completion& c : held) Forward(c);
  return static_cast<int64_t>(held.size());
}

void FaultyTransferEngine::Forward(const Completion& c) {
  // A failed step carries no bytes and no fence: nothing of it is usable.
  const bool ok = c.status.ok();
  listener_->OnStepDone(StepDone{.op_id = c.site.op_id,
                                 .direction = c.site.direction,
                                 .rank = c.site.rank,
                                 .step = c.site.step,
                                 .status = c.status,
                                 .bytes = c.bytes,
                                 .fence = ok ? c.fence : std::string()});
}

void FaultyTransferEngine::OnStepDone(StepDone done) {
  Completion c{TransferSite{done.op_id, done.direction, done.rank, done.step},
               std::move(done.status), done.bytes, std::move(done.fence)};
  {
    MutexLock lock(&mu_);
    ++completions_;
    auto it = chosen_.find(c.site);
    if (it != chosen_.end()) {
      absl::Status injected = std::move(it->second.front());
      it->second.erase(it->second.begin());
      if (it->second.empty()) chosen_.erase(it);
      if (c.status.ok()) {
        c.status = std::move(injected);
        injected_sites_.push_back(c.site);
      }
    }
    if (hold_ && hold_(c.site)) {
      held_.push_back(std::move(c));
      return;
    }
  }
  Forward(c);
}

}  // namespace hicache
