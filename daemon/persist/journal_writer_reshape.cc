// JournalWriter::Split and Reparent: the tree's structural changes to live
// records, written as the Drop and Put records the format already has (so
// the reader replays them with no new record type). Records carry no tokens
// (a page's key stays in its PageKeyStore slot and its checksum moves with
// it), so a split only divides the page lists.
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/persist/journal_writer.h"

namespace hicache::persist {

std::optional<PutRecord> JournalWriter::LiveRecordLocked(
    uint64_t persist_id) const {
  auto it = live_.find(persist_id);
  if (it == live_.end()) return std::nullopt;
  const std::string& frame = *it->second.frame;
  absl::StatusOr<PutRecord> put = DecodePutPayload(absl::string_view(frame).substr(
      kFramePrefixSize, frame.size() - kFrameOverhead));
  // Frames in live_ were encoded by this writer from validated records.
  if (!put.ok()) return std::nullopt;
  return *std::move(put);
}

absl::Status JournalWriter::ReplaceLocked(absl::Span<const uint64_t> drops,
                                          absl::Span<const PutRecord> puts) {
  std::string frames;
  std::vector<std::shared_ptr<const std::string>> encoded;
  for (const PutRecord& put : puts) {
    absl::StatusOr<std::string> frame = EncodePutRecord(put);
    if (!frame.ok()) return frame.status();
    encoded.push_back(std::make_shared<const std::string>(*std::move(frame)));
  }
  for (uint64_t id : drops) {
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    stats_.live_bytes -= it->second.frame->size();
    live_.erase(it);
    frames += EncodeDropRecord(id);
    ++stats_.drops;
  }
  for (size_t i = 0; i < puts.size(); ++i) {
    frames += *encoded[i];
    stats_.live_bytes += encoded[i]->size();
    live_.insert_or_assign(puts[i].persist_id,
                           Live{puts[i].parent_persist_id, encoded[i]});
    ++stats_.puts;
  }
  EnqueueLocked(std::make_shared<const std::string>(std::move(frames)));
  stats_.live_puts = static_cast<int64_t>(live_.size());
  PublishLocked();
  return absl::OkStatus();
}

absl::Status JournalWriter::Split(uint64_t persist_id, int64_t at,
                                  uint64_t head_id) {
  {
    MutexLock lock(&mu_);
    if (!broken_.ok()) return BrokenError();
    std::optional<PutRecord> old = LiveRecordLocked(persist_id);
    if (!old.has_value()) {
      ++stats_.unknown_drops;
      return absl::OkStatus();
    }
    const int64_t page = geometry_.page_size;
    if (at <= 0 || at >= old->logical_len || at % page != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Split: token ", at, " is not a page boundary inside ",
                       "persist_id ", persist_id, " (", old->logical_len,
                       " tokens)"));
    }
    if (head_id == 0 || head_id == persist_id || live_.contains(head_id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Split: head persist_id ", head_id, " is 0 or live"));
    }
    const size_t head_pages = static_cast<size_t>(at / page);
    PutRecord head;
    head.persist_id = head_id;
    head.parent_persist_id = old->parent_persist_id;
    head.name_space = old->name_space;
    head.logical_len = at;
    head.page_owners.assign(old->page_owners.begin(),
                            old->page_owners.begin() + head_pages);
    PutRecord tail;
    tail.persist_id = persist_id;
    tail.parent_persist_id = head_id;
    tail.name_space = old->name_space;
    tail.logical_len = old->logical_len - at;
    tail.page_owners.assign(old->page_owners.begin() + head_pages,
                            old->page_owners.end());
    const size_t ranks = old->host_pages.size();
    head.host_pages.resize(ranks);
    head.checksums.resize(ranks);
    tail.host_pages.resize(ranks);
    tail.checksums.resize(ranks);
    // Rank r stores its pages in position order: the head's are the first
    // as many as the head's positions rank r owns.
    for (size_t r = 0; r < ranks; ++r) {
      size_t owned = 0;
      for (uint32_t owner : head.page_owners) owned += owner == r;
      const auto& pages = old->host_pages[r];
      const auto& sums = old->checksums[r];
      head.host_pages[r].assign(pages.begin(), pages.begin() + owned);
      head.checksums[r].assign(sums.begin(), sums.begin() + owned);
      tail.host_pages[r].assign(pages.begin() + owned, pages.end());
      tail.checksums[r].assign(sums.begin() + owned, sums.end());
    }
    for (const PutRecord* part : {&head, &tail}) {
      if (absl::Status valid = ValidatePut(*part, geometry_); !valid.ok()) {
        return absl::InvalidArgumentError(valid.message());
      }
    }
    const uint64_t drops[] = {persist_id};
    const PutRecord puts[] = {std::move(head), std::move(tail)};
    if (absl::Status s = ReplaceLocked(drops, puts); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status JournalWriter::Reparent(uint64_t child, uint64_t parent) {
  {
    MutexLock lock(&mu_);
    if (!broken_.ok()) return BrokenError();
    std::optional<PutRecord> record = LiveRecordLocked(child);
    if (!record.has_value()) {
      ++stats_.unknown_drops;
      return absl::OkStatus();
    }
    record->parent_persist_id = parent;
    if (absl::Status valid = ValidatePut(*record, geometry_); !valid.ok()) {
      return absl::InvalidArgumentError(valid.message());
    }
    const uint64_t drops[] = {child};
    const PutRecord puts[] = {*std::move(record)};
    if (absl::Status s = ReplaceLocked(drops, puts); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace hicache::persist
