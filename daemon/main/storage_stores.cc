#include "daemon/main/storage_stores.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/storage/file_page_store.h"
#include "daemon/storage/redis_page_store.h"
#include "spdlog/spdlog.h"

namespace hicache {

absl::StatusOr<std::vector<std::unique_ptr<PageStore>>> OpenStorageStores(
    const DaemonConfig& config, const KvGeometry& geometry) {
  std::vector<std::unique_ptr<PageStore>> stores;
  const DaemonConfig::Storage& s = config.storage;
  if (!s.redis_address.empty()) {
    // One shared store: every rank's pages under the same keys scheme.
    absl::StatusOr<std::unique_ptr<RedisPageStore>> redis =
        RedisPageStore::Open(
            {.address = s.redis_address,
             .key_prefix = s.redis_key_prefix,
             .page_bytes = static_cast<int64_t>(geometry.BytesPerPage())});
    if (!redis.ok()) return redis.status();
    spdlog::info("storage tier: {}", (*redis)->Describe());
    stores.push_back(*std::move(redis));
    return stores;
  }
  if (s.dir.empty()) return stores;
  if (::mkdir(s.dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::UnavailableError(
        absl::StrCat("creating l3_dir ", s.dir, ": ", std::strerror(errno)));
  }
  for (uint32_t r = 0; r < config.cp_size; ++r) {
    FilePageStoreOptions o;
    o.directory = s.dir;
    o.name = absl::StrCat("rank", r);
    o.page_bytes = static_cast<int64_t>(geometry.BytesPerPage());
    o.capacity_pages = s.pages_per_rank;
    // What the bytes mean: a store of another layout starts empty.
    o.format =
        geometry.HostFingerprint(HostLayout::kPageFirst, 1, config.cp_size);
    o.io = s.io == "io_uring"  ? FilePageStoreOptions::Io::kUring
           : s.io == "threads" ? FilePageStoreOptions::Io::kThreads
                               : FilePageStoreOptions::Io::kAuto;
    o.queue_depth = s.queue_depth;
    absl::StatusOr<std::unique_ptr<FilePageStore>> store =
        FilePageStore::Open(std::move(o));
    if (!store.ok()) {
      return absl::Status(store.status().code(),
                          absl::StrCat("the storage tier of rank ", r, ": ",
                                       store.status().message()));
    }
    const StoreIndex::OpenReport& report = (*store)->open_report();
    spdlog::info("storage tier rank {}: {} pages kept from before{}{}", r,
                 report.entries, report.discarded.empty() ? "" : "; dropped: ",
                 report.discarded);
    stores.push_back(*std::move(store));
  }
  return stores;
}

}  // namespace hicache
