#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/core/mutex.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache {

// One completion a transfer engine reports: (op, direction, rank, step) of a
// submitted task.
struct TransferSite {
  uint64_t op_id = 0;
  TransferDirection direction = TransferDirection::kDeviceToHost;
  Rank rank = 0;
  uint32_t step = 0;

  bool operator==(const TransferSite&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const TransferSite& s) {
    return H::combine(std::move(h), s.op_id, s.direction, s.rank, s.step);
  }
};

// "op 7 d2h rank 1 step 2".
std::string SiteString(const TransferSite& site);

// What an injected failure reports, how many sites it fails, and whether
// the bytes still move.
struct TransferFault {
  absl::Status status = absl::DataLossError("injected transfer fault");
  int64_t times = 1;         // Sites that fail; -1: every matching site.
  bool copy_anyway = false;  // Move the bytes; fail the status only.
};

// Seeded random faults: each site fails with its direction's probability.
struct RandomTransferFaults {
  uint64_t seed = 0;
  double device_to_host = 0;  // Backup copies (Submit).
  double host_to_device = 0;  // Load-back copies (Submit).
  absl::Status status = absl::UnavailableError("injected random transfer fault");
};

// FaultyTransferEngine: a TransferEngine decorator that injects copy
// failures, so tests can drive the cache through its failure paths. Cache
// logic never names it: the engine takes it through the
// EngineOptions::wrap_transfer seam.
//
// Contract:
//  * Decorator. The wrapped engine is built by the factory given to the
//    constructor, with the decorator as its listener. Every completion of the
//    wrapped engine passes through the decorator and reaches `listener`
//    exactly once, on the thread that reported it (or the thread calling
//    ReleaseHeld / Drain for held ones), with the wrapped engine's status
//    and bytes -- except a completion chosen to fail, which carries the
//    injected status instead. A real error of the wrapped engine is never
//    replaced.
//  * Choice. A site is chosen when its task is submitted: first by the rules, in the order they were added (FailAt:
//    one exact site; FailWhen: a predicate), each failing at most
//    `Fault::times` sites; then by the random faults: a site fails with the
//    probability of its direction, decided by a hash of (seed, site), so a
//    seed fails the same sites whatever the thread interleaving.
//  * Effect. By default a failing rank's copy is dropped: its page lists are
//    emptied before the wrapped engine sees the task, so no byte moves and
//    the destination keeps what it held, as after a real failed copy (the
//    wrapped engine then does not validate that rank's pages). With
//    `Fault::copy_anyway` the copy runs and only the status changes.
//  * Holding. Completions accepted by the HoldWhen predicate are kept back
//    (after any fault is applied) until ReleaseHeld or Drain, so a test can
//    order completions against other calls.
//  * Validation errors of the wrapped engine pass through unchanged; the
//    faults chosen for a task that was not queued are withdrawn and their
//    rules get the budget back.
//  * Fences are the wrapped engine's (passed through).
//  * Thread-safe. Configuration, Submit, Drain and completions may
//    run concurrently. Lock order: mu_ is a leaf; neither the wrapped engine
//    nor the listener is called with it held. Predicates run with it held
//    and must not call the decorator.
class FaultyTransferEngine final : public TransferEngine,
                                   public TransferListener {
 public:
  using Predicate = std::function<bool(const TransferSite&)>;

  using Fault = TransferFault;
  using RandomFaults = RandomTransferFaults;

  // `listener` must outlive the decorator. `make_inner` is called once, here.
  FaultyTransferEngine(TransferListener* listener,
                       const TransferEngineFactory& make_inner);
  // Destroys the wrapped engine first; completions still held are dropped.
  ~FaultyTransferEngine() override;

  // Fails exactly `site` (for `fault.times` submissions of it).
  void FailAt(const TransferSite& site, Fault fault = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  // Fails sites `predicate` accepts, up to `fault.times` of them.
  void FailWhen(Predicate predicate, Fault fault = {}) ABSL_LOCKS_EXCLUDED(mu_);
  // Replaces the random faults (probabilities 0 turn them off).
  void SetRandom(RandomFaults random) ABSL_LOCKS_EXCLUDED(mu_);
  // Holds completions `predicate` accepts (nullptr: hold none from now on).
  void HoldWhen(Predicate predicate) ABSL_LOCKS_EXCLUDED(mu_);
  // Forwards every held completion, in arrival order, on the calling thread.
  // Returns how many.
  int64_t ReleaseHeld() ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the rules, the random faults and the hold predicate. Faults
  // already chosen for submitted tasks still apply; held completions stay
  // held until ReleaseHeld or Drain.
  void Clear() ABSL_LOCKS_EXCLUDED(mu_);

  // Failures injected so far: completions reported failed, and their sites
  // in the order they were reported.
  int64_t injected() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<TransferSite> injected_sites() const ABSL_LOCKS_EXCLUDED(mu_);
  // Completions received from the wrapped engine, and those now held.
  int64_t completions() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t held() const ABSL_LOCKS_EXCLUDED(mu_);

  // TransferEngine.
  absl::Status Submit(TransferTask task) override ABSL_LOCKS_EXCLUDED(mu_);
  // Drains the wrapped engine, then forwards every held completion.
  void Drain() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<uint64_t> RegisterFence(Rank rank,
                                         const std::string& handle) override;
  absl::Status ReleaseFence(uint64_t fence) override;
  absl::StatusOr<Rank> FenceRank(uint64_t fence) const override;

  // TransferListener: the wrapped engine's completions.
  void OnStepDone(StepDone done) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Rule {
    Predicate when;
    Fault fault;
  };
  // A fault chosen for a site of a task being submitted, and the rule whose
  // budget it took (-1: random), to give back if the task is not queued.
  struct Choice {
    TransferSite site;
    int rule = -1;
  };
  struct Completion {
    TransferSite site;
    absl::Status status;
    uint64_t bytes = 0;
    std::string fence;
  };

  // The fault for `site`, if it is chosen; consumes a rule's budget.
  // `rule` (if given) receives the index of the deciding rule, -1 if random.
  const Fault* ChooseLocked(const TransferSite& site, int* rule = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forward(const Completion& completion) ABSL_LOCKS_EXCLUDED(mu_);

  TransferListener* const listener_;
  mutable Mutex mu_;
  std::vector<Rule> rules_ ABSL_GUARDED_BY(mu_);
  uint64_t rules_generation_ ABSL_GUARDED_BY(mu_) = 0;  // Bumped by Clear.
  RandomFaults random_ ABSL_GUARDED_BY(mu_);
  Fault random_fault_ ABSL_GUARDED_BY(mu_);  // random_'s status, as a Fault.
  Predicate hold_ ABSL_GUARDED_BY(mu_);
  // Statuses chosen at submission for sites whose completion is pending.
  absl::flat_hash_map<TransferSite, std::vector<absl::Status>> chosen_
      ABSL_GUARDED_BY(mu_);
  std::vector<Completion> held_ ABSL_GUARDED_BY(mu_);
  std::vector<TransferSite> injected_sites_ ABSL_GUARDED_BY(mu_);
  int64_t completions_ ABSL_GUARDED_BY(mu_) = 0;
  // Last member: destroyed first, while the state above is still alive for
  // the completions its workers report on the way out.
  std::unique_ptr<TransferEngine> inner_;
};

}  // namespace hicache
