#include "daemon/engine/host_tier_recorder.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <utility>

#include "daemon/core/background_thread.h"
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
  if (options_.background) {
    // Low, not idle: the journal must keep up when every core is busy
    // (daemon/core/background_thread.h).
    hasher_ = std::make_unique<BackgroundWorker>("host-tier journal recorder",
                                                 BackgroundClass::kLow);
  }
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

namespace {

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void HostTierRecorder::OnHostCommitted(HostCommit& commit) {
  // Counted as the worker uncounts it (the record's page_owners).
  const int64_t pages =
      static_cast<int64_t>(commit.host->page_owners().size());
  Event event;
  {
    MutexLock lock(&mu_);
    if (overrun_ || queued_pages_ + pages > options_.max_queued_pages) {
      // Behind by more than the bound: this node is not recorded (nothing
      // of it is queued, so its later events name an id the journal does
      // not know, which it ignores). Its key is never read.
      ++calls_;
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
  persist::PutRecord& put = event.put.record;
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
  // The key is not copied here: the tree keeps its blocks for the worker.
  event.put.key_blocks.assign(commit.key_blocks.begin(),
                              commit.key_blocks.end());
  event.put.tokens = commit.tokens;
  commit.key_read_later = Enqueue(std::move(event));
}

void HostTierRecorder::OnHostReparented(uint64_t child, uint64_t parent) {
  Event event;
  event.kind = Event::Kind::kReparent;
  event.id = child;
  event.other = parent;
  Enqueue(std::move(event));
}

void HostTierRecorder::OnHostDropped(uint64_t persist_id) {
  // Its pages are freed right after this returns: the worker learns of the
  // drop from the queue before it can trust a checksum it took (see
  // HandleBatch), so a commit of this node not handled yet is discarded.
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

bool HostTierRecorder::Enqueue(Event event) {
  MutexLock lock(&mu_);
  return EnqueueLocked(std::move(event));
}

bool HostTierRecorder::EnqueueLocked(Event event) {
  ++calls_;
  if (enqueued_ - handled_ >= options_.max_queued_events) {
    // So far behind that even drops and splits would pile up without bound:
    // from now on nothing is recorded (the worker discards every commit not
    // journaled yet, as one whose later events are lost could be hashed
    // over reused pages). The host tier of this run will not survive a
    // restart; what is durable already stays safe (§4 of the design).
    if (!overrun_) {
      overrun_ = true;
      spdlog::error("host-tier journal: {} events waiting for the recorder; "
                    "it stops recording until the daemon restarts",
                    enqueued_ - handled_);
    }
  }
  if (overrun_) {
    ++stats_.events_refused;
    if (event.kind == Event::Kind::kPut) {
      queued_pages_ -=
          static_cast<int64_t>(event.put.record.page_owners.size());
    }
    return false;
  }
  event.queued_ns = SteadyNowNs();
  event.call = calls_;
  queue_.push_back(std::move(event));
  ++enqueued_;
  // A worker with something settling wakes by itself when the oldest has
  // settled (this one is younger); only an empty one needs waking. One
  // futex wake-up per burst, not one an event.
  if (worker_empty_) {
    worker_empty_ = false;
    work_cv_.Signal();
  }
  return true;
}

void HostTierRecorder::Track(const Event& event) {
  switch (event.kind) {
    case Event::Kind::kPut: {
      const uint64_t id = event.put.record.persist_id;
      pending_[id] = {.root = id, .end = event.put.record.logical_len};
      return;
    }
    case Event::Kind::kSplit:
      // The head takes the node's first `at` tokens, and some of the pages
      // of a pending commit: dropping it frees them.
      if (auto it = pending_.find(event.id); it != pending_.end()) {
        Segment& tail = it->second;
        const Segment head{.root = tail.root,
                           .start = tail.start,
                           .end = tail.start + event.at};
        tail.start = head.end;
        heads_[head.root].push_back(event.other);
        pending_[event.other] = head;  // May rehash: `tail` is not used.
      }
      return;
    case Event::Kind::kDrop:
      if (auto it = pending_.find(event.id); it != pending_.end()) {
        dropped_.insert(it->second.root);
        dropped_parts_.insert(event.id);
      }
      return;
    case Event::Kind::kReparent:
      // Only a first part's parent can change (every other part's parent
      // is the part before it).
      if (auto it = pending_.find(event.id);
          it != pending_.end() && it->second.start == 0) {
        first_parent_[it->second.root] = event.other;
      }
      return;
  }
}

bool HostTierRecorder::FirstPartSurvives(uint64_t root) const {
  auto first = [&](uint64_t id) {
    auto it = pending_.find(id);
    return it != pending_.end() && it->second.start == 0;
  };
  uint64_t id = root;
  if (!first(root)) {
    auto heads = heads_.find(root);
    if (heads == heads_.end()) return false;
    auto head = std::find_if(heads->second.begin(), heads->second.end(), first);
    if (head == heads->second.end()) return false;
    id = *head;
  }
  return !dropped_parts_.contains(id);
}

std::vector<HostTierRecorder::Part> HostTierRecorder::SurvivingParts(
    uint64_t root) const {
  std::vector<Part> parts;
  auto add = [&](uint64_t id) {
    if (auto it = pending_.find(id); it != pending_.end()) {
      parts.push_back({.id = id, .start = it->second.start,
                       .end = it->second.end});
    }
  };
  add(root);
  if (auto heads = heads_.find(root); heads != heads_.end()) {
    for (uint64_t head : heads->second) add(head);
  }
  std::sort(parts.begin(), parts.end(),
            [](const Part& a, const Part& b) { return a.start < b.start; });
  // Parts after a dropped one would be orphans at recovery: not recorded.
  size_t kept = 0;
  int64_t next = 0;
  while (kept < parts.size() && parts[kept].start == next &&
         !dropped_parts_.contains(parts[kept].id)) {
    next = parts[kept++].end;
  }
  parts.resize(kept);
  return parts;
}

std::vector<persist::PutRecord> HostTierRecorder::CutIntoParts(
    const persist::PutRecord& whole, uint64_t first_parent,
    const std::vector<Part>& parts, int64_t page_size) {
  std::vector<persist::PutRecord> out;
  out.reserve(parts.size());
  const size_t ranks = whole.host_pages.size();
  std::vector<size_t> next(ranks, 0);  // Per rank: the next page's index.
  size_t position = 0;
  uint64_t parent = first_parent;
  for (const Part& part : parts) {
    persist::PutRecord& record = out.emplace_back();
    record.persist_id = part.id;
    record.parent_persist_id = parent;
    record.name_space = whole.name_space;
    record.logical_len = part.end - part.start;
    record.host_pages.resize(ranks);
    record.checksums.resize(ranks);
    const size_t end_position =
        static_cast<size_t>((part.end + page_size - 1) / page_size);
    for (; position < end_position && position < whole.page_owners.size();
         ++position) {
      const Rank r = whole.page_owners[position];
      record.page_owners.push_back(r);
      record.host_pages[r].push_back(whole.host_pages[r][next[r]]);
      record.checksums[r].push_back(whole.checksums[r][next[r]]);
      ++next[r];
    }
    parent = part.id;
  }
  return out;
}

void HostTierRecorder::InBackground(absl::FunctionRef<void()> work) {
  if (hasher_ != nullptr) {
    hasher_->Run(work);
  } else {
    work();
  }
}

bool HostTierRecorder::TakeQueue(std::vector<Event>* arrived) {
  const size_t before = arrived->size();
  std::vector<Event>& into = arrived->empty() ? *arrived : taken_;
  bool overrun = false;
  {
    // O(1): a swap. The queue gets back an emptied vector that keeps its
    // capacity, so that the engine's threads do not grow it again.
    MutexLock lock(&mu_);
    into.swap(queue_);
    overrun = overrun_;
  }
  if (&into == &taken_) {
    std::move(taken_.begin(), taken_.end(), std::back_inserter(*arrived));
    taken_.clear();
  }
  for (size_t i = before; i < arrived->size(); ++i) Track((*arrived)[i]);
  return overrun;
}

void HostTierRecorder::Run() {
  // This thread keeps the daemon's priority: it takes the lock that the
  // engine's threads take (briefly). The heavy part of each batch (keys,
  // checksums, journal calls) runs on hasher_, in the background, holding
  // none of their locks.
  const int64_t settle_ns = absl::ToInt64Nanoseconds(options_.settle);
  const int64_t wake_ns =
      settle_ns + absl::ToInt64Nanoseconds(options_.batch_delay);
  // Taken from the queue, in order, not handled yet (still settling).
  std::vector<Event> settling;
  while (true) {
    bool all = false;
    {
      MutexLock lock(&mu_);
      // Until the oldest event has settled (and batch_delay more), a Flush
      // or a stop. With nothing queued or settling it waits to be woken,
      // Flush or not (every event is handled then: a Flush is satisfied).
      while (!stop_) {
        if (settling.empty() && queue_.empty()) {
          // Every call so far is handled (or was refused): nothing reads a
          // key any more, whatever the last handled batch was.
          keys_read_through_.store(calls_, std::memory_order_release);
          worker_empty_ = true;
          work_cv_.Wait(&mu_);
          continue;
        }
        if (flush_wanted_ > 0) break;
        const int64_t oldest = settling.empty() ? queue_.front().queued_ns
                                                : settling.front().queued_ns;
        const int64_t left = oldest + wake_ns - SteadyNowNs();
        if (left <= 0) break;
        work_cv_.WaitWithTimeout(&mu_, absl::Nanoseconds(left));
      }
      worker_empty_ = false;
      all = stop_ || flush_wanted_ > 0;
      if (stop_ && queue_.empty() && settling.empty()) return;
    }
    TakeQueue(&settling);
    // The settled prefix (all of it for a Flush or a stop: a Flush waits
    // only for events queued before it, all of which are here), handled in
    // order, kMaxBatch at a time. What arrives meanwhile waits in arrived_.
    size_t due = settling.size();
    if (!all) {
      const int64_t cutoff = SteadyNowNs() - settle_ns;
      due = 0;
      while (due < settling.size() && settling[due].queued_ns <= cutoff) ++due;
    }
    for (size_t begin = 0; begin < due; begin += kMaxBatch) {
      HandleBatch(absl::MakeSpan(settling).subspan(
          begin, std::min(kMaxBatch, due - begin)));
    }
    settling.erase(settling.begin(), settling.begin() + due);
    std::move(arrived_.begin(), arrived_.end(), std::back_inserter(settling));
    arrived_.clear();
  }
}

void HostTierRecorder::HandleBatch(absl::Span<Event> batch) {
  // 0. A Put whose first part is dropped already would be discarded in
  //    step 2 whatever its checksums: its key is not copied and it is not
  //    hashed (on a churning host tier, most commits).
  for (Event& event : batch) {
    event.recordable =
        event.kind == Event::Kind::kPut &&
        (!dropped_.contains(event.put.record.persist_id) ||
         FirstPartSurvives(event.put.record.persist_id));
  }
  // 1. Keys into their slots and checksums, no lock held. Each Put's pages'
  //    KV bytes may be another node's by now, if a part of it was dropped
  //    (step 2 finds out); its key tokens are held and cannot change.
  InBackground([&] {
    for (Event& event : batch) {
      if (options_.before_event) options_.before_event();
      if (!event.recordable) continue;
      event.recordable = StoreKeyAndChecksum(&event.put, &event.hashed_bytes);
    }
  });
  // 2. What was reported meanwhile. The tree reports a drop before the
  //    engine frees its pages, so a Put none of whose parts is dropped by
  //    this take had its pages while it was hashed (before the take); one
  //    with a part dropped may have hashed reused bytes there: only its
  //    parts before the first dropped one are recorded (those pages were
  //    never freed), as records of their own, and the splits that made
  //    them are not journaled; with none, it is discarded.
  const bool overrun = TakeQueue(&arrived_);
  Tally tally;
  for (Event& event : batch) {
    if (event.kind == Event::Kind::kSplit) {
      event.recorded_as_part = recorded_heads_.erase(event.other) > 0;
      continue;
    }
    if (event.kind != Event::Kind::kPut) continue;
    const uint64_t id = event.put.record.persist_id;
    tally.pages += static_cast<int64_t>(event.put.record.page_owners.size());
    tally.hashed_bytes += event.hashed_bytes;
    if (dropped_.erase(id) > 0 && event.recordable && !overrun) {
      const std::vector<Part> parts = SurvivingParts(id);
      if (parts.empty()) {
        event.recordable = false;
      } else {
        auto reparented = first_parent_.find(id);
        event.put.parts = CutIntoParts(
            event.put.record,
            reparented != first_parent_.end() ? reparented->second
                                              : event.put.record.parent_persist_id,
            parts, options_.geometry.page_size());
        for (const Part& part : parts) {
          if (part.id != id) recorded_heads_.insert(part.id);
        }
        ++tally.puts_cut;
      }
    }
    if (!event.recordable || overrun) {
      event.recordable = false;
      ++tally.puts_discarded;
    }
    dropped_parts_.erase(id);
    first_parent_.erase(id);
    pending_.erase(id);
    if (auto heads = heads_.find(id); heads != heads_.end()) {
      for (uint64_t head : heads->second) {
        pending_.erase(head);
        dropped_parts_.erase(head);
      }
      heads_.erase(heads);
    }
    event.put.key_blocks.clear();
  }
  // Nothing reads the keys of this batch (or of anything before it) any
  // more: the tree may reuse their blocks.
  keys_read_through_.store(batch.back().call, std::memory_order_release);
  // 3. The journal, in the tree's order, no lock held.
  InBackground([&] {
    for (const Event& event : batch) Handle(event, &tally);
  });
  const int64_t handed_ns = SteadyNowNs();
  for (const Event& event : batch) tally.lag.Add(handed_ns - event.queued_ns);
  for (Event& event : batch) {
    if (event.kind != Event::Kind::kPut) continue;
    if (spares_.size() >= kMaxSparePuts) break;
    event.put.record.checksums.clear();  // Recomputed for every record.
    event.put.parts.clear();
    spares_.push_back(std::move(event.put));
  }
  // 4. Counted, and the records handed back: O(1) under the lock.
  MutexLock lock(&mu_);
  if (!tally.first_error.ok() && stats_.journal_errors == 0) {
    spdlog::error("host-tier journal: {}; the host tier will not survive a "
                  "restart",
                  tally.first_error);
  }
  stats_.puts += tally.puts;
  stats_.puts_discarded += tally.puts_discarded;
  stats_.puts_cut += tally.puts_cut;
  stats_.lag.Merge(tally.lag);
  stats_.puts_refused += tally.puts_refused;
  stats_.journal_errors += tally.journal_errors;
  stats_.hashed_bytes += tally.hashed_bytes;
  stats_.events += static_cast<int64_t>(batch.size());
  queued_pages_ -= tally.pages;
  handled_ += static_cast<int64_t>(batch.size());
  if (spare_puts_.empty()) spare_puts_.swap(spares_);
  idle_cv_.SignalAll();  // Flush waits for handled_ to pass its mark.
}

bool HostTierRecorder::StoreKeyAndChecksum(Put* put, uint64_t* bytes) {
  persist::PutRecord& record = put->record;
  // The key's pages, in the tree's blocks (kept from reuse until this batch
  // is handled).
  if (put->tokens == nullptr ||
      !put->tokens->Pages(put->key_blocks, record.logical_len, &key_pages_)) {
    return false;
  }
  // The key first: the slots are written by this thread only, in the tree's
  // order (see the header).
  if (absl::Status stored = options_.keys->WriteNode(
          record.page_owners, record.host_pages, key_pages_);
      !stored.ok()) {
    spdlog::error("host-tier journal: the key of node {}: {}",
                  record.persist_id, stored);
    return false;
  }
  record.checksums.assign(record.host_pages.size(), {});
  for (size_t r = 0; r < record.host_pages.size(); ++r) {
    if (record.host_pages[r].empty()) continue;
    const HostPool* pool = nullptr;
    for (const HostPool& candidate : options_.pools) {
      if (candidate.rank == r) pool = &candidate;
    }
    if (pool == nullptr) return false;
    HICACHE_RACY_READS_BEGIN();
    absl::StatusOr<std::vector<uint64_t>> sums = HostPageChecksums(
        options_.geometry, options_.layout, options_.host_pages_per_rank,
        pool->bytes, record.host_pages[r]);
    HICACHE_RACY_READS_END();
    if (!sums.ok()) {
      spdlog::error("host-tier journal: checksumming node {}: {}",
                    record.persist_id, sums.status());
      return false;
    }
    record.checksums[r] = *std::move(sums);
    *bytes += record.host_pages[r].size() * options_.geometry.BytesPerPage();
  }
  // Each page's tokens (those just written to its slot) into its checksum.
  return persist::ForEachPage(
      record, options_.geometry.page_size(),
      [&](const persist::PutPage& page) {
        uint64_t& checksum = record.checksums[page.rank][page.index];
        checksum = PageRecordChecksum(checksum, key_pages_[page.position]);
      });
}

void HostTierRecorder::Handle(const Event& event, Tally* tally) const {
  persist::JournalWriter* journal = options_.journal;
  switch (event.kind) {
    case Event::Kind::kPut:
      if (!event.recordable) return;
      if (event.put.parts.empty()) {
        Count(journal->Put(event.put.record), /*put=*/true, tally);
      }
      for (const persist::PutRecord& part : event.put.parts) {
        // A part the journal refuses ends the record: the next would name a
        // parent it does not hold.
        const absl::Status status = journal->Put(part);
        Count(status, /*put=*/true, tally);
        if (!status.ok()) break;
      }
      return;
    case Event::Kind::kDrop:
      Count(journal->Drop(event.id), /*put=*/false, tally);
      return;
    case Event::Kind::kSplit:
      if (event.recorded_as_part) return;
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
  HostTierRecorderStats stats = stats_;
  stats.backlog_events = enqueued_ - handled_;
  return stats;
}

}  // namespace hicache
