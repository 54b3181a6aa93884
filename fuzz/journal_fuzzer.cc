// Fuzz target: hot-restart recovery from a hostile journal
// (docs/hot-restart.md §8). The input drives a structured journal: records
// built with the real encoder from fuzzed fields (ids, parents, namespaces,
// keys, owners, pages in and out of range, right or wrong checksums), plus
// raw bytes appended or flipped. The journal is loaded and recovered into a
// fresh tree over small real pools; the tree and the allocators must pass
// their invariant checks, and every restored page must verify. Nothing may
// crash, hang or allocate without bound. JOURNAL_FUZZER_STATS=1 prints what
// each input loaded and restored (to see that inputs reach recovery).
//
//   bazel build --config=fuzz //fuzz:journal_fuzzer
//   bazel-out/k8-fastbuildfuzz/bin/fuzz/journal_fuzzer -max_total_time=60 \
//       CORPUS_DIR fuzz/corpus/journal
//
// Found: journal_format.cc copied an empty array through a null pointer
// (memcpy(nullptr, p, 0), undefined behaviour; UBSan).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "daemon/alloc/host_page_allocator.h"
#include "daemon/engine/host_tier_recovery.h"
#include "daemon/persist/journal_format.h"
#include "daemon/persist/journal_reader.h"
#include "daemon/pool/kv_geometry.h"
#include "daemon/pool/page_checksum.h"
#include "daemon/pool/page_key_store.h"
#include "daemon/radix/radix_tree.h"

namespace {

using hicache::persist::JournalGeometry;
using hicache::persist::PutRecord;

constexpr uint32_t kPage = 4;
constexpr uint32_t kRanks = 2;
constexpr int64_t kHostPages = 32;

// Reads fuzz bytes as numbers; zeros when they run out.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint32_t Next(uint32_t below) {
    if (below == 0) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 2 && pos_ < size_; ++i) v = (v << 8) | data_[pos_++];
    return v % below;
  }
  bool Done() const { return pos_ >= size_; }
  std::string Rest() {
    std::string out(reinterpret_cast<const char*>(data_ + pos_), size_ - pos_);
    pos_ = size_;
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "journal_fuzzer: %s\n", what);
    std::abort();
  }
}

struct World {
  hicache::KvGeometry geometry = *hicache::KvGeometry::Preset("tiny", kPage);
  std::vector<std::vector<uint8_t>> pools;
  JournalGeometry journal{.page_size = kPage,
                          .cp_size = kRanks,
                          .kv_fingerprint = 7,
                          .host_layout = "layer_first",
                          .host_pages_per_rank = kHostPages,
                          .instance = "fuzz"};
  World() {
    for (uint32_t r = 0; r < kRanks; ++r) {
      std::vector<uint8_t> bytes(geometry.PoolBytes(kHostPages));
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = (i * 131 + r) & 0xff;
      pools.push_back(std::move(bytes));
    }
  }
  uint64_t Checksum(uint32_t rank, int64_t page) const {
    auto sum = hicache::HostPageChecksum(geometry,
                                         hicache::HostLayout::kLayerFirst,
                                         kHostPages, pools[rank], page);
    return sum.ok() ? *sum : 0;
  }
};

const World& TheWorld() {
  static const World* const world = new World();
  return *world;
}

// A Put from fuzzed fields: mostly well-formed, sometimes not. Its tokens go
// to its pages' slots in `keys` (when in range), as the recorder writes them.
PutRecord MakePut(Input& in, const World& w, hicache::PageKeyStore& keys) {
  PutRecord put;
  put.persist_id = 1 + in.Next(12);
  put.parent_persist_id = in.Next(4) == 0 ? 0 : in.Next(14);
  put.name_space = in.Next(3) == 0 ? "b" : "";
  const uint32_t pages = 1 + in.Next(4);
  put.logical_len = static_cast<int64_t>(pages) * kPage - in.Next(kPage);
  if (in.Next(8) == 7) put.logical_len += in.Next(9);  // Shape mismatch.
  put.host_pages.resize(kRanks);
  put.checksums.resize(kRanks);
  for (uint32_t i = 0; i < pages; ++i) {
    const uint32_t owner = in.Next(kRanks);
    put.page_owners.push_back(owner);
    const int64_t page = in.Next(kHostPages + 2);  // Sometimes out of range.
    put.host_pages[owner].push_back(page);
    const bool right = in.Next(6) != 5;
    std::vector<int32_t> tokens(static_cast<size_t>(std::clamp<int64_t>(
        put.logical_len - int64_t{i} * kPage, 0, kPage)));
    for (int32_t& t : tokens) t = static_cast<int32_t>(in.Next(5));
    const bool stored = keys.Write(owner, page, tokens).ok();
    put.checksums[owner].push_back(
        right && stored ? hicache::PageRecordChecksum(w.Checksum(owner, page),
                                                      tokens)
                        : in.Next(65535));
  }
  return put;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  (void)TheWorld();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const World& w = TheWorld();
  Input in(data, size);
  // The pages' keys, fresh for each input (the journal records none).
  std::unique_ptr<hicache::PageKeyStore> keys =
      *hicache::PageKeyStore::InMemory(kRanks, kHostPages, kPage);
  std::string file = hicache::persist::EncodeFileHeader();
  // Rare cases take the highest value: a spent input reads zeros.
  if (in.Next(16) != 15) {
    file += *hicache::persist::EncodeGeometryRecord(w.journal);
  }
  for (int records = 0; records < 40 && !in.Done(); ++records) {
    switch (in.Next(8)) {
      case 6:
        file += hicache::persist::EncodeDropRecord(1 + in.Next(12));
        break;
      case 7:
        file += in.Rest();  // Raw bytes: a torn or garbage tail.
        break;
      default: {
        absl::StatusOr<std::string> put =
            hicache::persist::EncodePutRecord(MakePut(in, w, *keys));
        if (put.ok()) file += *put;
        break;
      }
    }
  }
  if (!file.empty() && in.Next(4) == 3) {
    file[in.Next(static_cast<uint32_t>(file.size()))] ^= 0x5a;
  }
  absl::StatusOr<hicache::persist::LoadedJournal> loaded =
      hicache::persist::LoadJournalBytes(file, &w.journal);
  if (!loaded.ok()) {
    if (std::getenv("JOURNAL_FUZZER_STATS") != nullptr) {
      std::fprintf(stderr, "not loaded: %s\n",
                   std::string(loaded.status().message()).c_str());
    }
    return 0;
  }

  auto tree = hicache::RadixTree::Create(
      {.page_size = kPage, .cp_size = kRanks});
  Check(tree.ok(), "tree");
  std::vector<std::unique_ptr<hicache::HostPageAllocator>> owned;
  std::vector<hicache::HostPageAllocator*> allocators;
  std::vector<absl::Span<const uint8_t>> pools;
  for (uint32_t r = 0; r < kRanks; ++r) {
    owned.push_back(std::make_unique<hicache::HostPageAllocator>(
        *hicache::HostPageAllocator::Create(kHostPages)));
    allocators.push_back(owned.back().get());
    pools.emplace_back(w.pools[r]);
  }
  absl::StatusOr<hicache::HostTierRecovery> recovered =
      hicache::RecoverHostTier(*loaded, {.tree = tree->get(),
                                         .allocators = allocators,
                                         .geometry = w.geometry,
                                         .layout = hicache::HostLayout::kLayerFirst,
                                         .host_pages_per_rank = kHostPages,
                                         .pools = pools,
                                         .keys = keys.get(),
                                         .verify_threads = 1});
  Check(recovered.ok(), "RecoverHostTier refused a loaded journal");
  if (std::getenv("JOURNAL_FUZZER_STATS") != nullptr) {
    std::fprintf(stderr, "records %lld restored %lld dropped %lld/%lld/%lld\n",
                 static_cast<long long>(recovered->records),
                 static_cast<long long>(recovered->nodes_recovered),
                 static_cast<long long>(recovered->dropped_checksum),
                 static_cast<long long>(recovered->dropped_orphan),
                 static_cast<long long>(recovered->dropped_conflict));
  }
  Check((*tree)->CheckInvariants().ok(), "tree invariants after recovery");
  int64_t used = 0;
  for (auto* a : allocators) {
    Check(a->CheckInvariants().ok(), "allocator invariants");
    used += a->used_pages();
  }
  Check(used == recovered->pages_recovered, "reserved pages != recovered");
  // Every restored page verifies, KV bytes and key: nothing unverified is
  // ever matchable.
  for (const PutRecord& put : recovered->survivors) {
    const bool shaped = hicache::persist::ForEachPage(
        put, kPage, [&](const hicache::persist::PutPage& page) {
          const int64_t host_page = put.host_pages[page.rank][page.index];
          absl::StatusOr<absl::Span<const int32_t>> tokens =
              keys->Read(page.rank, host_page, page.tokens);
          Check(tokens.ok(), "a restored page has no key slot");
          Check(hicache::PageRecordChecksum(w.Checksum(page.rank, host_page),
                                            *tokens) ==
                    put.checksums[page.rank][page.index],
                "a restored page does not verify");
        });
    Check(shaped, "a restored record is misshapen");
  }
  return 0;
}
