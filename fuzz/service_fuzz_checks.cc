// The checks of //fuzz:service_fuzzer (Run, service_fuzz_run.h): no answer
// says the daemon is broken, a refused call changes nothing, and after
// every input every page is accounted for.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"
#include "fuzz/service_fuzz_report.h"
#include "fuzz/service_fuzz_run.h"
#include "grpcpp/support/status.h"

namespace hicache::fuzz {

namespace {

bool IsBrokenState(grpc::StatusCode code) {
  return code == grpc::StatusCode::INTERNAL ||
         code == grpc::StatusCode::UNKNOWN ||
         code == grpc::StatusCode::DATA_LOSS;
}

}  // namespace

void Run::Check(absl::string_view what, const grpc::Status& status) {
  Trace("    -> ", what, ": ", status.error_code(), " ",
        status.error_message());
  if (IsBrokenState(status.error_code())) {
    Fail(absl::StrCat(what, " answered code ", status.error_code(), ": ",
                      status.error_message()),
         engine_.get());
  }
}

void Run::Check(absl::string_view what, const absl::Status& status) {
  Trace("    -> ", what, ": ", status.ToString());
  if (absl::IsInternal(status) || absl::IsUnknown(status) ||
      absl::IsDataLoss(status)) {
    Fail(absl::StrCat(what, ": ", status.ToString()), engine_.get());
  }
}

// A refused call changes nothing the sessions hold (SessionManager: a
// request "fails with a clear error and changes nothing", Lock and Allocate
// are all or nothing, Unlock releases nothing then; Admit: "any other error
// undoes the whole call"; Complete: "a bad item changes nothing at all").
// Only the fuzzer's thread changes the sessions' locks and pages.
void Run::CheckRefusalChangedNothing(absl::string_view what,
                                     const grpc::Status& status,
                                     const SessionManager::Totals& before) {
  if (status.ok()) return;
  const SessionManager::Totals after = sessions_->totals();
  if (after.locks != before.locks || after.pages != before.pages) {
    Fail(absl::StrCat(what, " was refused (", status.error_code(), ": ",
                      status.error_message(),
                      ") yet changed what the sessions hold: locks ",
                      before.locks, " -> ", after.locks, ", pages ",
                      before.pages, " -> ", after.pages),
         engine_.get());
  }
}

// With no session open and no copy in flight: nothing is held but by the
// tree, and the host pool holds committed copies only.
void Run::CheckSettled(absl::string_view when) {
  auto fail = [&](const std::string& what) {
    Fail(absl::StrCat(when, ": ", what), engine_.get());
  };
  if (absl::Status s = engine_->CheckInvariants(); !s.ok()) {
    fail(absl::StrCat("CheckInvariants: ", s.ToString()));
  }
  const SessionManager::Totals totals = sessions_->totals();
  if (totals.sessions != 0 || totals.locks != 0 || totals.pages != 0) {
    fail(absl::StrCat("session totals not zero: sessions=", totals.sessions,
                      " locks=", totals.locks, " pages=", totals.pages));
  }
  const int64_t allocated = engine_->DeviceAllocatedPages();
  const int64_t tree = engine_->TreeDevicePages();
  if (allocated != tree) {
    fail(absl::StrCat(allocated, " device pages allocated but the tree holds ",
                      tree, " (", allocated - tree, " leaked)"));
  }
  const TreeStats stats = engine_->TreeStatistics();
  if (stats.protected_tokens != 0) {
    fail(absl::StrCat(stats.protected_tokens,
                      " device tokens still locked with no session open"));
  }
  if (stats.pending_backups != 0) {
    fail(absl::StrCat(stats.pending_backups,
                      " backups pending with every copy done"));
  }
  std::vector<int64_t> host(cp_, 0);
  int64_t device_pages = 0;
  DumpFilter all;
  for (const NodeInfo& n : engine_->Dump(all)) {
    absl::StatusOr<NodeInfo> info = engine_->Inspect(n.id);
    if (!info.ok()) {
      fail(absl::StrCat("Inspect(", n.id,
                        ") of a dumped node: ", info.status().ToString()));
    }
    if (info->lock_ref != 0) {
      fail(absl::StrCat("node ", n.id, " lock_ref ", info->lock_ref,
                        " with no session open"));
    }
    device_pages += static_cast<int64_t>(info->device_pages.size());
    for (size_t r = 0; r < info->host_pages.size() && r < cp_; ++r) {
      host[r] += static_cast<int64_t>(info->host_pages[r].size());
    }
  }
  if (device_pages != tree) {
    fail(absl::StrCat("nodes hold ", device_pages,
                      " device pages, the tree page set ", tree));
  }
  for (Rank r = 0; r < cp_; ++r) {
    if (engine_->HostUsedPages(r) != host[r]) {
      fail(absl::StrCat("rank ", r, ": ", engine_->HostUsedPages(r),
                        " host pages reserved, committed nodes hold ",
                        host[r]));
    }
  }
}

// Guarantees hold against operators too (docs/quotas.md): an eviction of
// everything in one tier leaves each guaranteed namespace at least what
// it held there or its guarantee, whichever is less. Then the quotas go,
// as an operator removes them to empty a daemon.
void Run::CheckGuaranteesThenClear(const std::vector<int64_t>& device,
                                   const std::vector<int64_t>& host) {
  for (int tier = 0; tier < 2; ++tier) {
    const std::vector<NamespaceQuotaUsage> before = engine_->NamespaceQuotas();
    absl::StatusOr<std::pair<int64_t, int64_t>> freed =
        tier == 0 ? engine_->EvictPages(device, {})
                  : engine_->EvictPages({}, host);
    Check("guarantees: EvictPages", freed.status());
    Settle();
    for (const NamespaceQuotaUsage& was : before) {
      const int64_t floor =
          tier == 0 ? was.quota.device_guaranteed : was.quota.host_guaranteed;
      const int64_t held = tier == 0 ? was.device_cached_pages : was.host_pages;
      for (const NamespaceQuotaUsage& now : engine_->NamespaceQuotas()) {
        if (now.quota.ns != was.quota.ns) continue;
        const int64_t kept =
            tier == 0 ? now.device_cached_pages : now.host_pages;
        if (kept < std::min(held, floor)) {
          Fail(absl::StrCat("an operator eviction took namespace '",
                            was.quota.ns, "' from ", held, " to ", kept,
                            tier == 0 ? " device" : " host",
                            " pages, below its guarantee of ", floor),
               engine_.get());
        }
      }
    }
  }
  for (const NamespaceQuotaUsage& usage : engine_->NamespaceQuotas()) {
    if (usage.quota.empty()) continue;
    Check("clear quota", engine_->SetNamespaceQuota({.ns = usage.quota.ns}));
  }
}

// Unpins every node and evicts everything: both pools must end empty.
void Run::Drain() {
  const std::vector<int64_t> device(cp_,
                                    engine_->options().device_pages_per_rank);
  const std::vector<int64_t> host(cp_, engine_->options().host_pages_per_rank);
  for (const NodeInfo& n : engine_->Dump(DumpFilter{})) {
    (void)engine_->Pin(n.id, absl::ZeroDuration());
  }
  CheckGuaranteesThenClear(device, host);
  for (int round = 0; round < 4; ++round) {
    for (const NodeInfo& n : engine_->Dump(DumpFilter{})) {
      (void)engine_->Pin(n.id, absl::ZeroDuration());
    }
    absl::StatusOr<std::pair<int64_t, int64_t>> freed =
        engine_->EvictPages(device, {});
    if (!freed.ok()) {
      Fail(absl::StrCat("drain: EvictPages(device): ",
                        freed.status().ToString()),
           engine_.get());
    }
    Settle();
    freed = engine_->EvictPages({}, host);
    if (!freed.ok()) {
      Fail(absl::StrCat("drain: EvictPages(host): ", freed.status().ToString()),
           engine_.get());
    }
    Settle();
  }
  CheckSettled("after evicting everything");
  int64_t host_used = 0;
  for (Rank r = 0; r < cp_; ++r) host_used += engine_->HostUsedPages(r);
  const TreeStats stats = engine_->TreeStatistics();
  if (engine_->DeviceAllocatedPages() != 0 || host_used != 0 ||
      stats.nodes != 0) {
    std::string left;
    for (const NodeInfo& n : engine_->Dump(DumpFilter{})) {
      absl::StrAppend(
          &left, "; node ", n.id, " (parent ", n.parent, ", tokens [", n.start,
          ", ", n.start + n.len, "), host_ref ", n.host_ref, ", lock_ref ",
          n.lock_ref, ", pending_backup ", n.pending_backup, ", pinned ",
          n.pin_remaining_ms, " ms, children ", n.num_children, ")");
    }
    Fail(absl::StrCat(
             "after evicting everything: ", engine_->DeviceAllocatedPages(),
             " device pages allocated, ", host_used, " host pages used, ",
             stats.nodes, " nodes left", left),
         engine_.get());
  }
}

}  // namespace hicache::fuzz
