// HiCacheEngine: the lanes of a dead CP member (docs/engine.md, "Engine:
// lanes of a dead member"; docs/cp-groups.md §4).
//
// A CP group's leader holds the tree and the page metadata of every lane,
// but the device and host pools of a follower's lanes live in the follower.
// When it dies, every byte on its lanes is gone, and a restarted follower
// comes back with fresh pools. The group then calls, in order:
//
//  * SetLanesUnavailable: nothing new lands on the lanes (no backup starts,
//    loads are misses) and no match returns a page recorded there;
//  * DropLanes: the tree forgets what lived there; what is in use (locked,
//    being loaded) is detached, unmatchable, and deleted on release; ops in
//    flight on those lanes fail; request pages there are tainted;
//  * SetLanesAvailable, once the follower rejoined with fresh pools.
#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/core/log_format.h"
#include "daemon/engine/engine_op.h"
#include "daemon/engine/hicache_engine.h"
#include "spdlog/spdlog.h"

namespace hicache {

namespace {

absl::Status CheckLanes(absl::Span<const Rank> lanes, uint32_t cp_size) {
  for (size_t i = 0; i < lanes.size(); ++i) {
    if (lanes[i] >= cp_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("lanes[", i, "] = ", lanes[i], " is outside [0, ",
                       cp_size, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status HiCacheEngine::SetLaneAvailability(absl::Span<const Rank> lanes,
                                                bool available) {
  if (absl::Status s = CheckLanes(lanes, layout_.cp_size()); !s.ok()) {
    return s;
  }
  MutexLock lock(&mu_);
  lane_down_.resize(layout_.cp_size(), false);
  lane_dropped_.resize(layout_.cp_size(), false);
  int64_t tainted = 0;
  for (Rank lane : lanes) {
    lane_down_[lane] = !available;
    // Readmitted after a drop: the lane's pool is a fresh one, so whatever
    // a request holds there was written (if at all) to the dead one.
    if (available && lane_dropped_[lane]) {
      tainted += TaintRequestPagesLocked(lane);
      lane_dropped_[lane] = false;
    }
  }
  if (tainted > 0) {
    spdlog::warn("{} request pages on readmitted lanes will not be cached",
                 tainted);
  }
  lanes_down_ = std::count(lane_down_.begin(), lane_down_.end(), true);
  tree_->SetUnmatchableLanes(lane_down_);
  spdlog::info("lanes [{}] {}; {} lane(s) unavailable",
               absl::StrJoin(lanes, ","),
               available ? "available" : "unavailable", lanes_down_);
  return absl::OkStatus();
}

std::vector<Rank> HiCacheEngine::UnavailableLanes() const {
  MutexLock lock(&mu_);
  std::vector<Rank> down;
  for (Rank l = 0; l < lane_down_.size(); ++l) {
    if (lane_down_[l]) down.push_back(l);
  }
  return down;
}

bool HiCacheEngine::BackupBlockedByLanesLocked(
    absl::Span<const LogicalPage> pages) {
  bool blocked = AnyLaneDownLocked();
  if (!blocked && !tainted_pages_.empty()) {
    for (LogicalPage page : pages) blocked |= tainted_pages_.contains(page);
  }
  if (blocked) ++stats_.backups_skipped_lane_unavailable;
  return blocked;
}

absl::StatusOr<InsertResult> HiCacheEngine::InsertCacheableLocked(
    absl::string_view ns, absl::Span<const int32_t> tokens,
    absl::Span<const LogicalPage> pages, const InsertOptions& options) {
  size_t cacheable = 0;
  if (AnyLaneDownLocked() || !tainted_pages_.empty()) {
    while (cacheable < pages.size() &&
           !tainted_pages_.contains(pages[cacheable]) &&
           !(AnyLaneDownLocked() &&
             lane_down_[layout_.LaneOf(pages[cacheable])])) {
      ++cacheable;
    }
  } else {
    cacheable = pages.size();
  }
  if (cacheable == pages.size()) {
    return tree_->Insert(ns, tokens, pages, options);
  }
  ++stats_.inserts_cut_by_lanes;
  InsertResult result;
  if (cacheable > 0) {
    const size_t len = cacheable * layout_.page_size();  // < tokens.size().
    absl::StatusOr<InsertResult> cut = tree_->Insert(
        ns, tokens.subspan(0, len), pages.subspan(0, cacheable), options);
    if (!cut.ok() || cut->deferred) return cut;
    result = *std::move(cut);
  }
  // Every page from the first uncacheable one on stays with its holder.
  result.uncached_pages.insert(result.uncached_pages.end(),
                               pages.begin() + cacheable, pages.end());
  return result;
}

int64_t HiCacheEngine::TaintRequestPagesLocked(Rank lane) {
  int64_t tainted = 0;
  for (PhysicalPage phys = 1; phys < options_.device_pages_per_rank; ++phys) {
    const LogicalPage page = layout_.LogicalPageOf(lane, phys);
    const std::optional<PageHolder> holder = ledger_.HolderOf(page);
    if (holder.has_value() && holder->kind == PageHolder::Kind::kRequest &&
        tainted_pages_.insert(page).second) {
      ++tainted;
    }
  }
  return tainted;
}

absl::Status HiCacheEngine::CheckDroppedLocked(
    absl::FunctionRef<absl::Status(Rank, int64_t)> hold_host) const {
  // Detached nodes still hold their host pages (reserved) and device pages
  // (the tree's in the ledger) until released.
  const LaneDropResult detached = tree_->DetachedPages();
  for (Rank r = 0; r < detached.freed_host_pages.size(); ++r) {
    for (int64_t p : detached.freed_host_pages[r]) {
      if (absl::Status s = hold_host(r, p); !s.ok()) return s;
    }
  }
  for (const auto& lane : detached.freed_pages) {
    for (LogicalPage p : lane) {
      if (!ledger_.IsHeldBy(p, PageHolder::Tree())) {
        return absl::InternalError(absl::StrCat(
            "dropped node's page ", p, " is not in the tree page set"));
      }
    }
  }
  for (LogicalPage p : tainted_pages_) {
    const std::optional<PageHolder> holder = ledger_.HolderOf(p);
    if (!holder.has_value() || holder->kind != PageHolder::Kind::kRequest) {
      return absl::InternalError(
          absl::StrCat("tainted page ", p, " is not held by a request"));
    }
  }
  return absl::OkStatus();
}

std::string HiCacheEngine::DroppedLaneHintLocked(LogicalPage page) const {
  const Rank lane = layout_.LaneOf(page);
  if (AnyLaneDownLocked() && lane_down_[lane]) {
    return absl::StrCat(" (or no longer servable: its lane ", lane,
                        " is unavailable, its CP member lost)");
  }
  if (tree_->DetachedNodes() > 0) {
    const LaneDropResult detached = tree_->DetachedPages();
    const auto& pages = detached.freed_pages[lane];
    if (std::find(pages.begin(), pages.end(), page) != pages.end()) {
      return " (or no longer servable: its node was dropped with the lanes "
             "of a lost CP member)";
    }
  }
  return "";
}

void HiCacheEngine::FreeDroppedLocked(const LaneDropResult& dropped,
                                      LaneDropCounts* counts) {
  for (const auto& lane : dropped.freed_pages) {
    ledger_.Remove(lane);
    FreeDeviceLocked(lane);
    if (counts != nullptr) counts->device_pages_freed += lane.size();
  }
  FreeHostLocked(dropped.freed_host_pages);
  if (counts != nullptr) {
    for (const auto& rank : dropped.freed_host_pages) {
      counts->host_pages_freed += rank.size();
    }
  }
  stats_.lane_nodes_removed += dropped.nodes_removed;
}

void HiCacheEngine::ReapDroppedLocked() {
  if (!tree_->HasReapable()) return;
  FreeDroppedLocked(tree_->ReapDetached(), nullptr);
}

absl::StatusOr<LaneDropCounts> HiCacheEngine::DropLanes(
    absl::Span<const Rank> lanes) {
  if (absl::Status s = CheckLanes(lanes, layout_.cp_size()); !s.ok()) {
    return s;
  }
  LaneDropCounts counts;
  std::vector<OpEvent> events;
  {
    MutexLock lock(&mu_);
    std::vector<bool> dead(layout_.cp_size(), false);
    for (Rank lane : lanes) dead[lane] = true;
    const LaneDropResult dropped = tree_->DropLanes(dead);
    counts.nodes_removed = dropped.nodes_removed;
    counts.nodes_detached = dropped.nodes_detached;
    counts.device_copies_dropped = dropped.device_copies_dropped;
    counts.host_copies_dropped = dropped.host_copies_dropped;
    FreeDroppedLocked(dropped, &counts);

    // Ops in flight that touch the lanes, or a node that went, end as
    // failed copies do: a backup never commits, a load is a miss.
    const absl::flat_hash_set<NodeId> aborted(dropped.aborted_backups.begin(),
                                              dropped.aborted_backups.end());
    auto touches = [&](const Op& op) {
      for (Rank owner : op.owners) {
        if (dead[owner]) return true;
      }
      return false;
    };
    std::vector<uint64_t> ids;
    for (const auto& [id, op] : ops_) ids.push_back(id);
    std::sort(ids.begin(), ids.end());
    for (uint64_t id : ids) {
      auto it = ops_.find(id);
      if (it == ops_.end()) continue;
      Op& op = *it->second;
      if (!OpInFlight(op.state)) continue;
      if (op.kind == Op::Kind::kBackup) {
        const bool attached = op.state == OpState::kAttached;
        const bool lost = attached && aborted.contains(op.node);
        if (!lost && !touches(op)) continue;
        AdvanceOpLocked(op, OpTrigger::kCopyFailed);
        ++stats_.backups_failed;
        ++counts.backups_failed;
        // The tree aborted the pending copy of a node it dropped; any other
        // attached backup of these lanes is aborted here.
        if (attached && !lost) (void)tree_->AbortBackup(op.node);
      } else {
        bool lost = touches(op) || tree_->IsDetached(op.locked_parent);
        for (const auto& [node, count] : op.chain) {
          lost |= tree_->IsDetached(node);
        }
        if (!lost) continue;
        AdvanceOpLocked(op, OpTrigger::kCopyFailed);
        ++stats_.loads_failed;
        ++counts.loads_failed;
      }
      ++stats_.lane_ops_failed;
      // Else the last completion finishes it (OnStepDone).
      if (op.outstanding == 0) FinishOpLocked(id, &events);
    }

    // Request pages on the lanes: theirs until freed, never cached (and
    // those allocated there before readmission: SetLaneAvailability).
    lane_dropped_.resize(layout_.cp_size(), false);
    for (Rank lane : lanes) {
      counts.request_pages_tainted += TaintRequestPagesLocked(lane);
      lane_dropped_[lane] = true;
    }
    ReapDroppedLocked();
    ++stats_.lane_drops;
    stats_.lane_nodes_detached += counts.nodes_detached;
    stats_.lane_device_copies_dropped += counts.device_copies_dropped;
    stats_.lane_host_copies_dropped += counts.host_copies_dropped;
    event_queue_.insert(event_queue_.end(), events.begin(), events.end());
    spdlog::warn(
        "dropped lanes [{}]: {} nodes removed, {} detached until released, "
        "{} device and {} host copies dropped, {} device and {} host pages "
        "freed, {} backups and {} loads failed, {} request pages tainted",
        absl::StrJoin(lanes, ","), counts.nodes_removed, counts.nodes_detached,
        counts.device_copies_dropped, counts.host_copies_dropped,
        counts.device_pages_freed, counts.host_pages_freed,
        counts.backups_failed, counts.loads_failed,
        counts.request_pages_tainted);
  }
  DispatchPending();
  return counts;
}

}  // namespace hicache
