#include "daemon/engine/host_tier_recorder.h"

#include <utility>

#include "daemon/core/log_format.h"
#include "daemon/pool/page_checksum.h"
#include "spdlog/spdlog.h"

// The worker may hash a page that is being reused by another node at that
// moment (the node was dropped after its commit was queued): by design, as
// that hash is then discarded (see the header). Those reads race with the
// copy that rewrites the page, so ThreadSanitizer is told to ignore them;
// every other access of the recorder stays checked.
#if defined(__SANITIZE_THREAD__)
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#define HICACHE_RACY_READS_BEGIN() AnnotateIgnoreReadsBegin(__FILE__, __LINE__)
#define HICACHE_RACY_READS_END() AnnotateIgnoreReadsEnd(__FILE__, __LINE__)
#else
#define HICACHE_RACY_READS_BEGIN() \
  do {                             \
  } while (false)
#define HICACHE_RACY_READS_END() \
  do {                           \
  } while (false)
#endif

namespace hicache {

HostTierRecorder::HostTierRecorder(Options options)
    : options_(std::move(options)) {
  worker_ = std::thread([this] { Run(); });
}

HostTierRecorder::~HostTierRecorder() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    work_cv_.SignalAll();
  }
  worker_.join();
}

void HostTierRecorder::OnHostCommitted(HostCommit& commit) {
  Event event;
  event.kind = Event::Kind::kPut;
  persist::PutRecord& put = event.put;
  put.persist_id = commit.persist_id;
  put.parent_persist_id = commit.parent_persist_id;
  put.name_space = std::string(commit.ns);
  event.key = std::move(commit.key);
  put.logical_len = commit.host->logical_len();
  put.page_owners.assign(commit.host->page_owners().begin(),
                         commit.host->page_owners().end());
  put.host_pages.resize(commit.host->cp_size());
  for (Rank r = 0; r < commit.host->cp_size(); ++r) {
    put.host_pages[r] = commit.host->host_pages(r);
  }
  {
    MutexLock lock(&mu_);
    unrecorded_.insert(commit.persist_id);
  }
  Enqueue(std::move(event));
}

void HostTierRecorder::OnHostReparented(uint64_t child, uint64_t parent) {
  Event event;
  event.kind = Event::Kind::kReparent;
  event.id = child;
  event.other = parent;
  Enqueue(std::move(event));
}

void HostTierRecorder::OnHostDropped(uint64_t persist_id) {
  {
    MutexLock lock(&mu_);
    // Its pages are freed right after this returns: a checksum not taken
    // yet could read another node's bytes.
    if (unrecorded_.contains(persist_id)) dropped_early_.insert(persist_id);
  }
  Event event;
  event.kind = Event::Kind::kDrop;
  event.id = persist_id;
  Enqueue(std::move(event));
}

void HostTierRecorder::OnHostSplit(uint64_t persist_id, int64_t at,
                                   uint64_t head_persist_id) {
  Event event;
  event.kind = Event::Kind::kSplit;
  event.id = persist_id;
  event.other = head_persist_id;
  event.at = at;
  Enqueue(std::move(event));
}

void HostTierRecorder::Enqueue(Event event) {
  MutexLock lock(&mu_);
  queue_.push_back(std::move(event));
  // A busy worker takes this one with its next batch: no wake-up needed.
  if (worker_waiting_) work_cv_.Signal();
}

void HostTierRecorder::Run() {
  std::deque<Event> batch;
  while (true) {
    {
      MutexLock lock(&mu_);
      busy_ = false;
      if (queue_.empty()) idle_cv_.SignalAll();
      worker_waiting_ = true;
      while (queue_.empty() && !stop_) work_cv_.Wait(&mu_);
      worker_waiting_ = false;
      if (queue_.empty()) return;  // Stopping, and everything handled.
      batch.swap(queue_);  // Everything queued, in order.
      busy_ = true;
    }
    for (Event& event : batch) {
      if (options_.before_event) options_.before_event();
      Handle(event);
    }
    const int64_t handled = static_cast<int64_t>(batch.size());
    batch.clear();
    MutexLock lock(&mu_);
    stats_.events += handled;
  }
}

bool HostTierRecorder::Checksum(persist::PutRecord* put,
                                uint64_t* bytes) const {
  put->checksums.assign(put->host_pages.size(), {});
  for (size_t r = 0; r < put->host_pages.size(); ++r) {
    if (put->host_pages[r].empty()) continue;
    const HostPool* pool = nullptr;
    for (const HostPool& candidate : options_.pools) {
      if (candidate.rank == r) pool = &candidate;
    }
    if (pool == nullptr) return false;
    HICACHE_RACY_READS_BEGIN();
    absl::StatusOr<std::vector<uint64_t>> sums = HostPageChecksums(
        options_.geometry, options_.layout, options_.host_pages_per_rank,
        pool->bytes, put->host_pages[r]);
    HICACHE_RACY_READS_END();
    if (!sums.ok()) {
      spdlog::error("host-tier journal: checksumming node {}: {}",
                    put->persist_id, sums.status());
      return false;
    }
    put->checksums[r] = *std::move(sums);
    *bytes += put->host_pages[r].size() * options_.geometry.BytesPerPage();
  }
  return true;
}

bool HostTierRecorder::StoreKey(absl::Span<const int32_t> key,
                                persist::PutRecord* put) const {
  const size_t page_size = options_.geometry.page_size();
  if (static_cast<int64_t>(key.size()) != put->logical_len) return false;
  std::vector<size_t> next(put->host_pages.size(), 0);  // Per rank.
  for (size_t i = 0; i < put->page_owners.size(); ++i) {
    const uint32_t owner = put->page_owners[i];
    if (owner >= next.size() || next[owner] >= put->host_pages[owner].size()) {
      return false;
    }
    if (i * page_size >= key.size()) return false;
    const size_t k = next[owner]++;
    const absl::Span<const int32_t> tokens =
        key.subspan(i * page_size, page_size);
    if (!options_.keys->Write(owner, put->host_pages[owner][k], tokens).ok()) {
      return false;
    }
    put->checksums[owner][k] =
        PageRecordChecksum(put->checksums[owner][k], tokens);
  }
  return true;
}

void HostTierRecorder::Handle(Event& event) {
  persist::JournalWriter* journal = options_.journal;
  switch (event.kind) {
    case Event::Kind::kPut: {
      const uint64_t id = event.put.persist_id;
      uint64_t bytes = 0;
      const bool hashed = Checksum(&event.put, &bytes);
      {
        MutexLock lock(&mu_);
        unrecorded_.erase(id);
        stats_.hashed_bytes += bytes;
        if (dropped_early_.erase(id) > 0 || !hashed) {
          ++stats_.puts_discarded;
          return;
        }
      }
      if (!StoreKey(event.key, &event.put)) {
        spdlog::error("host-tier journal: the key of node {} does not fit its "
                      "pages",
                      id);
        MutexLock lock(&mu_);
        ++stats_.puts_discarded;
        return;
      }
      Count(journal->Put(event.put), /*put=*/true);
      return;
    }
    case Event::Kind::kDrop:
      Count(journal->Drop(event.id), /*put=*/false);
      return;
    case Event::Kind::kSplit:
      Count(journal->Split(event.id, event.at, event.other), /*put=*/false);
      return;
    case Event::Kind::kReparent:
      Count(journal->Reparent(event.id, event.other), /*put=*/false);
      return;
  }
}

void HostTierRecorder::Count(const absl::Status& status, bool put) {
  MutexLock lock(&mu_);
  if (status.ok()) {
    if (put) ++stats_.puts;
    return;
  }
  if (put && absl::IsResourceExhausted(status)) {
    ++stats_.puts_refused;
    return;
  }
  if (stats_.journal_errors++ == 0) {
    spdlog::error("host-tier journal: {}; the host tier will not survive a "
                  "restart",
                  status);
  }
}

absl::Status HostTierRecorder::Flush(bool clean) {
  {
    MutexLock lock(&mu_);
    while (!queue_.empty() || busy_) idle_cv_.Wait(&mu_);
  }
  return clean ? options_.journal->FlushClean() : options_.journal->Flush();
}

HostTierRecorderStats HostTierRecorder::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace hicache
