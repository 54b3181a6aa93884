#include "daemon/group/copy_digest.h"

#include <xxhash.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "daemon/core/le_bytes.h"

namespace hicache::group {
namespace {

constexpr size_t kChunkBytes = 8 * 64;

// The bytes being hashed, emptied: one buffer per thread, so hashing
// allocates nothing after a thread's first call.
std::string* Scratch() {
  thread_local std::string buf;
  buf.clear();
  buf.reserve(kChunkBytes);
  return &buf;
}

// XXH3 over the little-endian bytes of `values` (each as a u64), chained
// through `seed` 64 values at a time.
template <typename T>
uint64_t HashValues(const std::vector<T>& values, uint64_t seed) {
  std::string* buf = Scratch();
  LeWriter w(buf);
  uint64_t h = seed;
  for (T v : values) {
    w.U64(static_cast<uint64_t>(v));
    if (buf->size() == kChunkBytes) {
      h = XXH3_64bits_withSeed(buf->data(), buf->size(), h);
      buf->clear();
    }
  }
  if (!buf->empty()) h = XXH3_64bits_withSeed(buf->data(), buf->size(), h);
  return h;
}

struct Field {
  const char* name;
  uint64_t RankTally::*member;
  bool geometry;  // Not compared when the leader's is 0.
};

constexpr Field kFields[] = {
    {"device pages per rank", &RankTally::device_pages_per_rank, true},
    {"host pages per rank", &RankTally::host_pages_per_rank, true},
    {"copies device->host", &RankTally::copies_d2h, false},
    {"copies host->device", &RankTally::copies_h2d, false},
    {"pages device->host", &RankTally::pages_d2h, false},
    {"pages host->device", &RankTally::pages_h2d, false},
    {"copies refused", &RankTally::refused, false},
    {"copy hash", &RankTally::hash, false},
};

const RankTally* FindIn(const std::vector<RankTally>& v, uint32_t rank) {
  for (const RankTally& t : v) {
    if (t.rank == rank) return &t;
  }
  return nullptr;
}

std::string Value(const Field& f, uint64_t v) {
  return f.member == &RankTally::hash ? absl::StrFormat("%#018x", v)
                                      : absl::StrCat(v);
}

}  // namespace

uint64_t CopyHash(uint64_t op_id, TransferDirection direction, uint32_t step,
                  const RankCopy& copy) {
  std::string* head = Scratch();
  LeWriter w(head);
  w.U64(op_id);
  w.U64(direction == TransferDirection::kDeviceToHost ? 0 : 1);
  w.U64(step);
  w.U64(copy.rank);
  w.U64(copy.device_pages.size());
  const uint64_t seed = XXH3_64bits(head->data(), head->size());
  return HashValues(copy.host_pages, HashValues(copy.device_pages, seed));
}

CopyTally::CopyTally(std::vector<Rank> ranks, int64_t device_pages_per_rank,
                     int64_t host_pages_per_rank) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  for (Rank r : ranks) {
    ranks_.push_back(RankTally{.rank = r,
                               .device_pages_per_rank = static_cast<uint64_t>(
                                   std::max<int64_t>(device_pages_per_rank, 0)),
                               .host_pages_per_rank = static_cast<uint64_t>(
                                   std::max<int64_t>(host_pages_per_rank, 0))});
  }
}

RankTally* CopyTally::Find(Rank rank) {
  for (RankTally& t : ranks_) {
    if (t.rank == rank) return &t;
  }
  return nullptr;
}

void CopyTally::Add(uint64_t op_id, TransferDirection direction, uint32_t step,
                    const RankCopy& copy) {
  RankTally* t = Find(copy.rank);
  if (t == nullptr) return;
  const uint64_t pages = copy.device_pages.size();
  if (direction == TransferDirection::kDeviceToHost) {
    ++t->copies_d2h;
    t->pages_d2h += pages;
  } else {
    ++t->copies_h2d;
    t->pages_h2d += pages;
  }
  // Ordered: the previous value seeds the next.
  const uint64_t h = CopyHash(op_id, direction, step, copy);
  std::string* buf = Scratch();
  LeWriter w(buf);
  w.U64(t->hash);
  w.U64(h);
  t->hash = XXH3_64bits(buf->data(), buf->size());
}

void CopyTally::AddTask(const TransferTask& task) {
  for (const RankCopy& copy : task.ranks) {
    Add(task.op_id, task.direction, task.step, copy);
  }
}

void CopyTally::AddRefused(Rank rank) {
  if (RankTally* t = Find(rank)) ++t->refused;
}

void CopyTally::SkewForTesting(Rank rank, int64_t pages) {
  if (RankTally* t = Find(rank)) t->pages_d2h += static_cast<uint64_t>(pages);
}

Digest CopyTally::Snapshot() const {
  return Digest{.tasks_frames = tasks_frames_, .ranks = ranks_};
}

std::string DescribeDivergence(uint64_t leader_frames,
                               const std::vector<RankTally>& leader,
                               uint64_t follower_frames,
                               const std::vector<RankTally>& follower) {
  std::vector<std::string> diffs;
  if (leader_frames != follower_frames) {
    diffs.push_back(absl::StrCat("tasks frames: leader ", leader_frames,
                                 ", follower ", follower_frames));
  }
  for (const RankTally& l : leader) {
    const RankTally* f = FindIn(follower, l.rank);
    if (f == nullptr) {
      diffs.push_back(
          absl::StrCat("rank ", l.rank, ": not accounted by the follower"));
      continue;
    }
    for (const Field& field : kFields) {
      const uint64_t lv = l.*field.member;
      const uint64_t fv = f->*field.member;
      if (lv == fv || (field.geometry && lv == 0)) continue;
      diffs.push_back(absl::StrCat("rank ", l.rank, " ", field.name,
                                   ": leader ", Value(field, lv), ", follower ",
                                   Value(field, fv)));
    }
  }
  for (const RankTally& f : follower) {
    if (FindIn(leader, f.rank) == nullptr) {
      diffs.push_back(
          absl::StrCat("rank ", f.rank, ": not accounted by the leader"));
    }
  }
  return absl::StrJoin(diffs, "; ");
}

std::string DescribeTallies(const std::vector<RankTally>& ranks) {
  std::vector<std::string> parts;
  for (const RankTally& t : ranks) {
    parts.push_back(absl::StrFormat(
        "rank %u: copies d2h %u h2d %u, pages d2h %u h2d %u, refused %u, "
        "hash %#018x, pools %u/%u pages",
        t.rank, t.copies_d2h, t.copies_h2d, t.pages_d2h, t.pages_h2d, t.refused,
        t.hash, t.device_pages_per_rank, t.host_pages_per_rank));
  }
  return parts.empty() ? "no rank" : absl::StrJoin(parts, "; ");
}

}  // namespace hicache::group
