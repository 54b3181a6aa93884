#include "daemon/engine/host_tier_recorder.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
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
  // Counted as the worker uncounts it (the record's page_owners).
  const int64_t pages =
      static_cast<int64_t>(commit.host->page_owners().size());
  Event event;
  {
    MutexLock lock(&mu_);
    if (queued_pages_ + pages > options_.max_queued_pages) {
      // Behind by more than the bound: this node is not recorded (nothing
      // of it is queued, so its later events name an id the journal does
      // not know, which it ignores).
      ++stats_.puts_refused;
      return;
    }
    // Reserved now, so that concurrent commits cannot pass the bound
    // together; the event is built outside the lock.
    queued_pages_ += pages;
    if (!spare_puts_.empty()) {
      event.put = std::move(spare_puts_.back());  // Refilled below.
      spare_puts_.pop_back();
    }
  }
  event.kind = Event::Kind::kPut;
  persist::PutRecord& put = event.put;
  put.persist_id = commit.persist_id;
  put.parent_persist_id = commit.parent_persist_id;
  put.name_space.assign(commit.ns.data(), commit.ns.size());
  put.logical_len = commit.host->logical_len();
  put.page_owners.assign(commit.host->page_owners().begin(),
                         commit.host->page_owners().end());
  put.host_pages.resize(commit.host->cp_size());
  for (Rank r = 0; r < commit.host->cp_size(); ++r) {
    put.host_pages[r] = commit.host->host_pages(r);
  }
  // The key goes to its pages' slots now, while the pages are the node's
  // (in the tree's order): the journal will record none of it. One call
  // for the whole node (checked once, one memcpy a page).
  event.key_stored =
      options_.keys->WriteNode(put.page_owners, put.host_pages,
                               commit.key_pages)
          .ok();
  MutexLock lock(&mu_);
  unrecorded_.insert(commit.persist_id);
  EnqueueLocked(std::move(event));
}

void HostTierRecorder::OnHostReparented(uint64_t child, uint64_t parent) {
  Event event;
  event.kind = Event::Kind::kReparent;
  event.id = child;
  event.other = parent;
  Enqueue(std::move(event));
}

void HostTierRecorder::OnHostDropped(uint64_t persist_id) {
  Event event;
  event.kind = Event::Kind::kDrop;
  event.id = persist_id;
  MutexLock lock(&mu_);
  // Its pages are freed right after this returns: a checksum not taken yet
  // could read another node's bytes.
  if (unrecorded_.contains(persist_id)) dropped_early_.insert(persist_id);
  EnqueueLocked(std::move(event));
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
  EnqueueLocked(std::move(event));
}

void HostTierRecorder::EnqueueLocked(Event event) {
  const bool first = queue_.empty();
  if (first) first_queued_ = absl::Now();
  queue_.push_back(std::move(event));
  ++enqueued_;
  // A busy worker takes this one with its next batch. A waiting one is woken
  // for a batch's first event (it then waits until max_delay after it) and
  // when the batch is full: two wake-ups a batch at most, not one an event.
  if (worker_waiting_ && (first || queue_.size() == options_.wake_batch)) {
    work_cv_.Signal();
  }
}

void HostTierRecorder::Run() {
  {
    // A lower priority (nice): under contention the worker yields to the
    // threads that serve, and catches up when the daemon is quieter (Flush
    // waits for it; the queue is bounded, see OnHostCommitted).
    if (options_.worker_nice > 0 &&
        setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()),
                    options_.worker_nice) != 0) {
      spdlog::warn("host-tier journal: the recorder could not lower its "
                   "priority; it runs at the daemon's");
    }
  }
  std::vector<Event> batch;
  while (true) {
    {
      MutexLock lock(&mu_);
      idle_cv_.SignalAll();  // Flush waits for handled_ to pass its mark.
      worker_waiting_ = true;
      while (queue_.empty() && !stop_) work_cv_.Wait(&mu_);
      // A batch: until wake_batch events, max_delay after the first, a
      // Flush or a stop.
      while (!stop_ && !flush_wanted_ && queue_.size() < options_.wake_batch) {
        const absl::Duration left =
            first_queued_ + options_.max_delay - absl::Now();
        if (left <= absl::ZeroDuration()) break;
        work_cv_.WaitWithTimeout(&mu_, left);
      }
      worker_waiting_ = false;
      if (queue_.empty()) return;  // Stopping, and everything handled.
      // Everything queued (a swap: nothing is copied under the lock, however
      // long a backlog), handled below in order, kMaxBatch at a time: a
      // Flush waits for the part that holds its mark, never for events
      // queued after it.
      batch.swap(queue_);
    }
    for (size_t begin = 0; begin < batch.size(); begin += kMaxBatch) {
      HandleBatch(absl::MakeSpan(batch).subspan(begin, kMaxBatch));
    }
    batch.clear();
  }
}

void HostTierRecorder::HandleBatch(absl::Span<Event> batch) {
  // 0. A Put whose node is already gone would be discarded in step 2
  //    whatever its checksums: it is not hashed at all (on a churning host
  //    tier that is a large share of the commits of a batch).
  {
    MutexLock lock(&mu_);
    for (Event& event : batch) {
      event.recordable = event.kind == Event::Kind::kPut &&
                         event.key_stored &&
                         !dropped_early_.contains(event.put.persist_id);
    }
  }
  // 1. Checksums, no lock held. Each Put's pages' KV bytes and their slots'
  //    tokens: both may be another node's by now, if it was dropped (step 2
  //    finds out).
  for (Event& event : batch) {
    if (options_.before_event) options_.before_event();
    if (!event.recordable) continue;
    event.recordable = Checksum(&event.put, &event.hashed_bytes) &&
                       MixKeyChecksums(&event.put);
  }
  // 2. One lock for the batch: a Put whose node was dropped since its commit
  //    was queued is discarded (its pages may have been reused while they
  //    were hashed). One that was not dropped by now was not dropped while
  //    it was hashed, before this check.
  {
    MutexLock lock(&mu_);
    for (Event& event : batch) {
      if (event.kind != Event::Kind::kPut) continue;
      const uint64_t id = event.put.persist_id;
      queued_pages_ -= static_cast<int64_t>(event.put.page_owners.size());
      unrecorded_.erase(id);
      stats_.hashed_bytes += event.hashed_bytes;
      if (dropped_early_.erase(id) > 0 || !event.recordable) {
        event.recordable = false;
        ++stats_.puts_discarded;
      }
    }
  }
  // 3. The journal, in the tree's order, no lock held.
  Tally tally;
  for (const Event& event : batch) Handle(event, &tally);
  // 4. Counted once.
  MutexLock lock(&mu_);
  if (!tally.first_error.ok() && stats_.journal_errors == 0) {
    spdlog::error("host-tier journal: {}; the host tier will not survive a "
                  "restart",
                  tally.first_error);
  }
  stats_.puts += tally.puts;
  stats_.puts_refused += tally.puts_refused;
  stats_.journal_errors += tally.journal_errors;
  stats_.events += static_cast<int64_t>(batch.size());
  handled_ += static_cast<int64_t>(batch.size());
  for (Event& event : batch) {
    if (event.kind != Event::Kind::kPut) continue;
    if (spare_puts_.size() >= kMaxSparePuts) break;
    event.put.checksums.clear();  // Recomputed for every record.
    spare_puts_.push_back(std::move(event.put));
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

bool HostTierRecorder::MixKeyChecksums(persist::PutRecord* put) const {
  bool read = true;
  const bool shaped = persist::ForEachPage(
      *put, options_.geometry.page_size(), [&](const persist::PutPage& page) {
        uint64_t& checksum = put->checksums[page.rank][page.index];
        HICACHE_RACY_READS_BEGIN();
        absl::StatusOr<absl::Span<const int32_t>> tokens = options_.keys->Read(
            page.rank, put->host_pages[page.rank][page.index], page.tokens);
        if (tokens.ok()) checksum = PageRecordChecksum(checksum, *tokens);
        HICACHE_RACY_READS_END();
        read = read && tokens.ok();
      });
  return shaped && read;
}

void HostTierRecorder::Handle(const Event& event, Tally* tally) const {
  persist::JournalWriter* journal = options_.journal;
  switch (event.kind) {
    case Event::Kind::kPut:
      if (event.recordable) Count(journal->Put(event.put), /*put=*/true, tally);
      return;
    case Event::Kind::kDrop:
      Count(journal->Drop(event.id), /*put=*/false, tally);
      return;
    case Event::Kind::kSplit:
      Count(journal->Split(event.id, event.at, event.other), /*put=*/false,
            tally);
      return;
    case Event::Kind::kReparent:
      Count(journal->Reparent(event.id, event.other), /*put=*/false, tally);
      return;
  }
}

void HostTierRecorder::Count(const absl::Status& status, bool put,
                             Tally* tally) {
  if (status.ok()) {
    if (put) ++tally->puts;
    return;
  }
  if (put && absl::IsResourceExhausted(status)) {
    ++tally->puts_refused;
    return;
  }
  if (tally->journal_errors++ == 0) tally->first_error = status;
}

absl::Status HostTierRecorder::Flush(bool clean) {
  {
    MutexLock lock(&mu_);
    // Waits for the events queued before this call only: a steady stream of
    // later commits cannot starve it.
    const int64_t mark = enqueued_;
    ++flush_wanted_;
    work_cv_.Signal();
    while (handled_ < mark) idle_cv_.Wait(&mu_);
    --flush_wanted_;
  }
  return clean ? options_.journal->FlushClean() : options_.journal->Flush();
}

HostTierRecorderStats HostTierRecorder::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace hicache
