#include "daemon/engine/storage_tier.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "daemon/pool/page_checksum.h"
#include "spdlog/spdlog.h"

namespace hicache {
namespace {

// Pages handed to a store per Put.
constexpr size_t kWriteBatch = 64;

}  // namespace

StorageTier::StorageTier(Options options, const CpLayout& layout,
                         const KvGeometry& geometry, const RankPools& pools)
    : options_(std::move(options)),
      layout_(layout),
      geometry_(geometry),
      pools_(pools),
      fingerprint_(geometry.HostFingerprint(HostLayout::kPageFirst, 1,
                                            layout.cp_size())) {
  writer_ = std::thread([this] { WriterLoop(); });
}

StorageTier::~StorageTier() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  writer_.join();
}

std::vector<StoreKey> StorageTier::Keys(absl::string_view ns,
                                        absl::Span<const int32_t> tokens,
                                        int64_t first, int64_t end) const {
  end = std::min<int64_t>(end, tokens.size() / layout_.page_size());
  if (end <= first) return {};
  std::vector<StoreKey> keys =
      StoreKeyChain::Keys(fingerprint_, ns, tokens, layout_.page_size(), end);
  keys.erase(keys.begin(), keys.begin() + first);
  return keys;
}

void StorageTier::Write(const CpHostMeta& host,
                        absl::Span<const StoreKey> keys) {
  const int64_t page_bytes = static_cast<int64_t>(geometry_.BytesPerPage());
  const int64_t pool_pages = pools_.options().host_pages_per_rank;
  std::vector<Job> jobs;
  std::vector<size_t> next(layout_.cp_size(), 0);  // Owned page # per rank.
  const int64_t n = std::min<int64_t>(keys.size(), host.num_pages());
  for (int64_t i = 0; i < host.num_pages(); ++i) {
    const Rank r = host.page_owners()[i];
    const int64_t page = host.host_pages(r)[next[r]++];
    if (i >= n) continue;
    KvPool* pool = pools_.host(r);
    if (pool == nullptr || pool->host_data() == nullptr) continue;
    Job job{r, keys[i], std::vector<uint8_t>(page_bytes)};
    const absl::Status s = ReadHostPage(
        geometry_, pools_.options().host_layout, pool_pages,
        absl::MakeConstSpan(static_cast<const uint8_t*>(pool->host_data()),
                            pool->size_bytes()),
        page, absl::MakeSpan(job.bytes));
    if (!s.ok()) {
      spdlog::error("storage tier: reading host page {} of rank {}: {}", page,
                    r, s.ToString());
      continue;
    }
    jobs.push_back(std::move(job));
  }
  MutexLock lock(&mu_);
  for (Job& job : jobs) {
    if (queued_bytes_ + page_bytes > options_.max_queued_bytes) {
      ++stats_.pages_dropped;
      continue;
    }
    queued_bytes_ += page_bytes;
    ++stats_.pages_queued;
    queue_.push_back(std::move(job));
  }
  cv_.SignalAll();
}

void StorageTier::WriterLoop() {
  while (true) {
    std::vector<Job> batch;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stop_) cv_.Wait(&mu_);
      if (queue_.empty()) return;
      // One store's jobs at a time, in order.
      const Rank store = queue_.front().store;
      while (!queue_.empty() && batch.size() < kWriteBatch &&
             options_.stores[queue_.front().store] == options_.stores[store]) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      writing_ += static_cast<int64_t>(batch.size());
    }
    std::vector<StorePut> puts;
    puts.reserve(batch.size());
    for (const Job& job : batch) puts.push_back({job.key, job.bytes});
    const std::vector<absl::Status> results =
        PutAndWait(*options_.stores[batch.front().store], std::move(puts));
    MutexLock lock(&mu_);
    for (size_t i = 0; i < batch.size(); ++i) {
      queued_bytes_ -= static_cast<int64_t>(batch[i].bytes.size());
      if (results[i].ok()) {
        ++stats_.pages_written;
      } else {
        ++stats_.write_errors;
      }
    }
    writing_ -= static_cast<int64_t>(batch.size());
    cv_.SignalAll();
  }
}

void StorageTier::Flush() {
  MutexLock lock(&mu_);
  while (!queue_.empty() || writing_ > 0) cv_.Wait(&mu_);
}

std::vector<int> StorageTier::Holders(absl::Span<const StoreKey> keys) const {
  std::vector<int> holders(keys.size(), -1);
  if (keys.empty()) return holders;
  const std::vector<StoreKey> all(keys.begin(), keys.end());
  for (Rank s = 0; s < options_.stores.size(); ++s) {
    bool repeat = false;
    for (Rank t = 0; t < s; ++t)
      repeat |= options_.stores[t] == options_.stores[s];
    if (repeat) continue;
    const std::vector<bool> found = ExistsAndWait(*options_.stores[s], all);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (holders[i] < 0 && found[i]) holders[i] = static_cast<int>(s);
    }
  }
  return holders;
}

std::vector<Rank> StorageTier::Present(absl::Span<const StoreKey> keys) const {
  std::vector<Rank> sources;
  for (int holder : Holders(keys)) {
    if (holder < 0) break;
    sources.push_back(static_cast<Rank>(holder));
  }
  return sources;
}

int64_t StorageTier::Read(absl::Span<const StoreKey> keys,
                          absl::Span<const Rank> sources,
                          absl::Span<const Rank> owners,
                          absl::Span<const int64_t> host_pages) {
  const size_t n =
      std::min({keys.size(), sources.size(), owners.size(), host_pages.size()});
  const Clock* clock =
      options_.clock != nullptr ? options_.clock : Clock::Real();
  const absl::Time start = clock->Now();
  const int64_t page_bytes = static_cast<int64_t>(geometry_.BytesPerPage());
  std::vector<std::vector<uint8_t>> bytes(n, std::vector<uint8_t>(page_bytes));
  std::vector<absl::Status> results(n);
  // One batch per distinct store.
  absl::flat_hash_map<PageStore*, std::vector<size_t>> by_store;
  for (size_t i = 0; i < n; ++i)
    by_store[options_.stores[sources[i]]].push_back(i);
  for (auto& [store, items] : by_store) {
    std::vector<StoreGet> gets;
    for (size_t i : items) gets.push_back({keys[i], absl::MakeSpan(bytes[i])});
    std::vector<absl::Status> got = GetAndWait(*store, std::move(gets));
    for (size_t j = 0; j < items.size(); ++j) results[items[j]] = got[j];
  }
  int64_t intact = 0;
  const int64_t pool_pages = pools_.options().host_pages_per_rank;
  for (size_t i = 0; i < n; ++i) {
    if (!results[i].ok()) break;
    KvPool* pool = pools_.host(owners[i]);
    if (pool == nullptr || pool->host_data() == nullptr) break;
    const absl::Status s =
        WriteHostPage(geometry_, pools_.options().host_layout, pool_pages,
                      absl::MakeSpan(static_cast<uint8_t*>(pool->host_data()),
                                     pool->size_bytes()),
                      host_pages[i], bytes[i]);
    if (!s.ok()) {
      spdlog::error("storage tier: writing host page {} of rank {}: {}",
                    host_pages[i], owners[i], s.ToString());
      break;
    }
    ++intact;
  }
  const double read_bytes = static_cast<double>(n) * page_bytes;
  const double ns = absl::ToDoubleNanoseconds(clock->Now() - start);
  MutexLock lock(&mu_);
  if (n > 0) {
    const double sample = ns / read_bytes;
    read_ns_per_byte_ =
        read_ns_per_byte_ == 0
            ? sample
            : read_ns_per_byte_ + (sample - read_ns_per_byte_) / 8;
  }
  stats_.pages_read += intact;
  stats_.read_failures += static_cast<int64_t>(n) - intact;
  return intact;
}

double StorageTier::ReadNsPerByte() const {
  MutexLock lock(&mu_);
  return read_ns_per_byte_;
}

StorageTier::Stats StorageTier::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

std::vector<PageStore*> StorageTier::DistinctStores() const {
  std::vector<PageStore*> out;
  for (PageStore* s : options_.stores) {
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

PageStoreStats StorageTier::StoreStats() const {
  PageStoreStats sum;
  for (PageStore* store : DistinctStores()) {
    const PageStoreStats s = store->Stats();
    sum.capacity_pages += s.capacity_pages;
    sum.used_pages += s.used_pages;
    sum.puts += s.puts;
    sum.put_duplicates += s.put_duplicates;
    sum.put_errors += s.put_errors;
    sum.put_bytes += s.put_bytes;
    sum.gets += s.gets;
    sum.get_hits += s.get_hits;
    sum.get_misses += s.get_misses;
    sum.checksum_failures += s.checksum_failures;
    sum.get_errors += s.get_errors;
    sum.get_bytes += s.get_bytes;
    sum.evictions += s.evictions;
    sum.removes += s.removes;
  }
  return sum;
}

std::vector<std::string> StorageTier::Describe() const {
  std::vector<std::string> out;
  for (PageStore* store : DistinctStores()) out.push_back(store->Describe());
  return out;
}

}  // namespace hicache
