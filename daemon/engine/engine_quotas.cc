// HiCacheEngine: per-namespace page quotas (docs/quotas.md). A limit caps
// what a namespace holds in a tier; a guarantee is what eviction for anyone
// else leaves it (RadixTree's EvictionScope enforces guarantees).
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/hicache_engine.h"
#include "spdlog/spdlog.h"

namespace hicache {

absl::Status HiCacheEngine::SetNamespaceQuota(const NamespaceQuota& quota) {
  if (absl::Status s = ValidateNamespaceQuota(quota); !s.ok()) return s;
  MutexLock lock(&mu_);
  const int64_t host_capacity =
      options_.host_pages_per_rank * static_cast<int64_t>(layout_.cp_size());
  // Guarantees must fit the pools together, or none could be honoured. Each
  // accepted one fits alone, so the sums below cannot overflow.
  if (quota.device_guaranteed > DevicePageCapacity() ||
      quota.host_guaranteed > host_capacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quota of namespace '", quota.ns, "': guarantees of ",
        quota.device_guaranteed, " device and ", quota.host_guaranteed,
        " host pages exceed the pools (", DevicePageCapacity(), " and ",
        host_capacity, ")"));
  }
  int64_t device = quota.device_guaranteed;
  int64_t host = quota.host_guaranteed;
  for (const auto& [ns, other] : quotas_) {
    if (ns == quota.ns) continue;
    device += other.device_guaranteed;
    host += other.host_guaranteed;
  }
  if (device > DevicePageCapacity() || host > host_capacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace guarantees would total ", device, " device and ", host,
        " host pages; the pools hold ", DevicePageCapacity(), " and ",
        host_capacity));
  }
  if (quota.empty()) {
    quotas_.erase(quota.ns);
  } else {
    quotas_[quota.ns] = quota;
  }
  tree_->SetGuarantee(quota.ns, {.device = quota.device_guaranteed,
                                 .host = quota.host_guaranteed});
  spdlog::info("namespace quota set: {}", FormatNamespaceQuota(quota));
  return absl::OkStatus();
}

std::vector<NamespaceQuotaUsage> HiCacheEngine::NamespaceQuotas() const {
  MutexLock lock(&mu_);
  absl::flat_hash_set<std::string> names;
  for (const auto& [ns, quota] : quotas_) names.insert(ns);
  for (const auto& [ns, holders] : ns_holders_) names.insert(ns);
  for (std::string& ns : tree_->Namespaces()) names.insert(std::move(ns));
  std::vector<NamespaceQuotaUsage> out;
  out.reserve(names.size());
  for (const std::string& ns : names) {
    NamespaceQuotaUsage usage;
    if (auto it = quotas_.find(ns); it != quotas_.end()) usage.quota = it->second;
    usage.quota.ns = ns;
    const NamespacePages pages = tree_->PagesOf(ns);
    usage.device_cached_pages = pages.device;
    usage.device_request_pages = RequestPagesOfLocked(ns);
    usage.host_pages = pages.host;
    out.push_back(std::move(usage));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.quota.ns < b.quota.ns;
  });
  return out;
}

void HiCacheEngine::BindHolder(uint64_t holder, absl::string_view ns) {
  if (holder == 0) return;  // In-process users: never counted.
  MutexLock lock(&mu_);
  if (auto it = holder_ns_.find(holder); it != holder_ns_.end()) {
    if (it->second == ns) return;
    if (auto h = ns_holders_.find(it->second); h != ns_holders_.end()) {
      h->second.erase(holder);
      if (h->second.empty()) ns_holders_.erase(h);
    }
  }
  holder_ns_[holder] = std::string(ns);
  ns_holders_[ns].insert(holder);
}

void HiCacheEngine::UnbindHolder(uint64_t holder) {
  MutexLock lock(&mu_);
  auto it = holder_ns_.find(holder);
  if (it == holder_ns_.end()) return;
  if (auto h = ns_holders_.find(it->second); h != ns_holders_.end()) {
    h->second.erase(holder);
    if (h->second.empty()) ns_holders_.erase(h);
  }
  holder_ns_.erase(it);
}

// The namespace a request holder's pages count against (nullopt: unbound),
// and that of a node (QuotaNamespaceOfLocked); both computed only while some
// quota is set (nullopt otherwise).
std::optional<absl::string_view> HiCacheEngine::HolderNamespaceLocked(
    uint64_t holder) const {
  // Without any quota no limit applies and no guarantee is kept: skip the
  // lookup (and the callers' copy) on the allocation path.
  if (quotas_.empty()) return std::nullopt;
  auto it = holder_ns_.find(holder);
  if (it == holder_ns_.end()) return std::nullopt;
  return absl::string_view(it->second);
}

std::optional<std::string> HiCacheEngine::QuotaNamespaceOfLocked(
    NodeId node) const {
  if (quotas_.empty()) return std::nullopt;
  absl::StatusOr<std::string> ns = tree_->NamespaceOf(node);
  if (!ns.ok()) return std::nullopt;
  return *std::move(ns);
}

// Device pages the requests of `ns`'s holders hold.
int64_t HiCacheEngine::RequestPagesOfLocked(absl::string_view ns) const {
  auto it = ns_holders_.find(ns);
  if (it == ns_holders_.end()) return 0;
  int64_t pages = 0;
  for (uint64_t holder : it->second) pages += ledger_.CountOfRequest(holder);
  return pages;
}

// Makes room under `ns`'s device (host) limit for `pages` more pages by
// evicting the namespace's own nodes (host: spread over the ranks as
// `per_rank`, the new pages' ranks); RESOURCE_EXHAUSTED (counted) when
// that is not enough. OK at once without a limit.
absl::Status HiCacheEngine::FitDeviceQuotaLocked(absl::string_view ns,
                                                 int64_t pages) {
  auto it = quotas_.find(ns);
  if (it == quotas_.end() || it->second.device_limit == 0) {
    return absl::OkStatus();
  }
  const int64_t limit = it->second.device_limit;
  auto held = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return tree_->PagesOf(ns).device + RequestPagesOfLocked(ns);
  };
  int64_t excess = held() + pages - limit;
  if (excess > 0 && pages <= limit) {
    // The namespace's own least valuable nodes go (demoted when backed,
    // dropped otherwise); nobody else's.
    const DeviceEvictResult evicted = ApplyDeviceEvictionLocked(
        tree_->EvictDeviceTokens(excess * layout_.page_size(),
                                 {.only_ns = ns}));
    for (const auto& lane : evicted.freed_pages) {
      stats_.quota_evicted_pages += static_cast<int64_t>(lane.size());
    }
    excess = held() + pages - limit;
  }
  if (excess <= 0) return absl::OkStatus();
  ++stats_.quota_refusals;
  return absl::ResourceExhaustedError(absl::StrCat(
      "namespace '", ns, "' is at its device limit: it holds ", held(),
      " of ", limit, " pages (cached and requests) and ", pages,
      " more do not fit after evicting what it could of its own"));
}

absl::Status HiCacheEngine::FitHostQuotaLocked(
    absl::string_view ns, absl::Span<const int64_t> per_rank) {
  auto it = quotas_.find(ns);
  if (it == quotas_.end() || it->second.host_limit == 0) {
    return absl::OkStatus();
  }
  const int64_t limit = it->second.host_limit;
  int64_t pages = 0;
  for (int64_t n : per_rank) pages += n;
  int64_t excess = tree_->PagesOf(ns).host + pages - limit;
  if (excess > 0 && pages <= limit) {
    // Take the excess from the ranks the new pages land on, in proportion.
    std::vector<int64_t> target(layout_.cp_size(), 0);
    for (Rank r = 0; r < layout_.cp_size(); ++r) {
      target[r] = (excess * per_rank[r] + pages - 1) / pages;
    }
    stats_.quota_evicted_pages +=
        EvictHostTargetsLocked(target, {.only_ns = ns});
    excess = tree_->PagesOf(ns).host + pages - limit;
  }
  if (excess <= 0) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "namespace '", ns, "' is at its host limit of ", limit, " pages"));
}

}  // namespace hicache
