// Randomized model-based test of RadixTree against a naive reference: a map
// from every cached prefix (one entry per page; a partial last page is an
// exact valid tail) to its device page and host copy. 100k mixed operations
// per seed, with the invariant checker after every step. Seeds run at C = 2
// and C = 4; owner-lane eviction is checked against its contract (every
// lane left short has no page that evicting more could reach). A tier
// listener (KV events, blocks of 2 tokens) is attached throughout: the
// blocks it was told each tier holds must be exactly the model's whole pages
// on that tier.
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "daemon/radix/block_hashes.h"
#include "daemon/radix/radix_tree.h"
#include "gtest/gtest.h"
#include "tests/testing/tier_recorder.h"

namespace hicache {
namespace {

constexpr uint32_t kP = 4;
constexpr uint32_t kBlock = 2;  // KV event blocks: two per page.
constexpr uint64_t kHashSeed = 7;

struct Entry {
  LogicalPage device = -1;               // -1: not on device.
  std::pair<Rank, int64_t> host{0, -1};  // host.second -1: no host copy.
  int64_t len = 0;                       // Tokens of this page (<= P).
};

class Model {
 public:
  std::map<std::vector<int32_t>, Entry> entries;

  const Entry* Find(const std::vector<int32_t>& key) const {
    auto it = entries.find(key);
    return it == entries.end() ? nullptr : &it->second;
  }
  Entry* FindByDevicePage(LogicalPage page) {
    for (auto& [key, e] : entries) {
      if (e.device == page) return &e;
    }
    return nullptr;
  }
  void EraseHost(Rank rank, int64_t host_page) {
    for (auto it = entries.begin(); it != entries.end(); ++it) {
      if (it->second.host == std::make_pair(rank, host_page)) {
        ASSERT_EQ(it->second.device, -1) << "removed a node still on device";
        entries.erase(it);
        return;
      }
    }
    FAIL() << "host page " << host_page << " of rank " << rank << " unknown";
  }
  // Expected MatchPrefix figures.
  void Match(const std::vector<int32_t>& q, int64_t* device_len,
             std::vector<LogicalPage>* pages, int64_t* host_len) const {
    *device_len = *host_len = 0;
    pages->clear();
    bool device_phase = true;
    int64_t pos = 0;
    const int64_t n = q.size();
    while (pos < n) {
      const int64_t len = std::min<int64_t>(kP, n - pos);
      const Entry* e =
          Find(std::vector<int32_t>(q.begin(), q.begin() + pos + len));
      if (e == nullptr) break;
      if (device_phase && e->device >= 0) {
        *device_len += len;
        pages->push_back(e->device);
      } else if (e->host.second >= 0) {
        device_phase = false;
        *host_len += len;
      } else {
        break;
      }
      if (len < kP) break;
      pos += len;
    }
  }
  std::set<LogicalPage> DevicePages() const {
    std::set<LogicalPage> pages;
    for (const auto& [k, e] : entries) {
      if (e.device >= 0) pages.insert(e.device);
    }
    return pages;
  }
  int64_t DeviceTokens() const {
    int64_t t = 0;
    for (const auto& [k, e] : entries) t += e.device >= 0 ? e.len : 0;
    return t;
  }
  int64_t HostTokens() const {
    int64_t t = 0;
    for (const auto& [k, e] : entries) t += e.host.second >= 0 ? e.len : 0;
    return t;
  }
  // What KV events must have announced: the blocks of every whole page, on
  // the tiers that hold it.
  std::set<testing::TierRecorder::Key> Announced() const {
    std::set<testing::TierRecorder::Key> out;
    for (const auto& [key, e] : entries) {
      if (e.len < kP) continue;
      std::vector<uint64_t> hashes;
      BlockHashes::Chain(BlockHashes::Seed("", kHashSeed), key, kBlock,
                         &hashes);
      for (size_t i = hashes.size() - kP / kBlock; i < hashes.size(); ++i) {
        if (e.device >= 0) out.insert({"", hashes[i], Tier::kDevice});
        if (e.host.second >= 0) out.insert({"", hashes[i], Tier::kHost});
      }
    }
    return out;
  }
};

// (seed, C).
class RadixModelTest
    : public ::testing::TestWithParam<std::pair<uint64_t, uint32_t>> {
 protected:
  void SetUp() override {
    rng_.seed(GetParam().first);
    cp_ = GetParam().second;
    tree_ = *RadixTree::Create(
        {.page_size = kP,
         .cp_size = cp_,
         .policy = static_cast<EvictionPolicy>(GetParam().first % 5),
         .clock = &clock_});
    ASSERT_TRUE(tree_->SetTierListener(&tiers_, kBlock, kHashSeed).ok());
    for (int i = 0; i < 12; ++i) {
      std::vector<int32_t> base(8 + rng_() % 40);
      for (auto& t : base) t = rng_() % 3;  // Tiny alphabet: lots of sharing.
      bases_.push_back(base);
    }
  }

  std::vector<int32_t> RandomKey() {
    const auto& base = bases_[rng_() % bases_.size()];
    std::vector<int32_t> key(base.begin(),
                             base.begin() + 1 + rng_() % base.size());
    if (rng_() % 3 == 0) {
      for (int i = rng_() % 10; i > 0; --i) key.push_back(rng_() % 3);
    }
    return key;
  }

  void CheckMatch(const std::vector<int32_t>& q) {
    auto got = tree_->MatchPrefix("", q, {.record_hit = rng_() % 2 == 0});
    ASSERT_TRUE(got.ok());
    int64_t device_len, host_len;
    std::vector<LogicalPage> pages;
    model_.Match(q, &device_len, &pages, &host_len);
    ASSERT_EQ(got->device_len, device_len) << "query of " << q.size();
    ASSERT_EQ(got->device_pages, pages);
    ASSERT_EQ(got->host_hit_len, host_len);
  }

  void DoInsert() {
    const std::vector<int32_t> key = RandomKey();
    std::vector<LogicalPage> pages((key.size() + kP - 1) / kP);
    for (auto& p : pages) p = next_page_++;
    const bool unfinished = rng_() % 5 == 0;
    const std::string before = DebugTree();
    auto r = tree_->Insert("", key, pages, {.unfinished = unfinished});
    ASSERT_TRUE(r.ok());
    last_op_ = "insert key";
    for (int32_t t : key) last_op_ += " " + std::to_string(t);
    last_op_ += " unfinished " + std::to_string(unfinished) + " cached " +
                std::to_string(r->cached_len) + " released";
    for (auto p : r->released_pages) last_op_ += " " + std::to_string(p);
    last_op_ += "\nbefore:\n" + before;
    if (r->deferred) {
      ++deferred_;
      return;
    }
    // Released tree pages: their (tail) entries are gone.
    for (LogicalPage p : r->released_pages) {
      auto it = model_.entries.begin();
      for (; it != model_.entries.end() && it->second.device != p; ++it) {
      }
      ASSERT_NE(it, model_.entries.end());
      ASSERT_LT(it->second.len, kP);
      ASSERT_EQ(it->second.host.second, -1);
      model_.entries.erase(it);
    }
    std::set<LogicalPage> duplicates(r->duplicate_pages.begin(),
                                     r->duplicate_pages.end());
    std::set<LogicalPage> uncached(r->uncached_pages.begin(),
                                   r->uncached_pages.end());
    const int64_t cached_pages = (r->cached_len + kP - 1) / kP;
    for (int64_t k = 0; k < static_cast<int64_t>(pages.size()); ++k) {
      const bool is_uncached = uncached.count(pages[k]) > 0;
      ASSERT_EQ(is_uncached, k >= cached_pages) << "page " << k;
      if (is_uncached) continue;
      const int64_t end = std::min<int64_t>((k + 1) * kP, r->cached_len);
      std::vector<int32_t> prefix(key.begin(), key.begin() + end);
      auto it = model_.entries.find(prefix);
      const bool duplicate = duplicates.count(pages[k]) > 0;
      if (it != model_.entries.end() && it->second.device >= 0) {
        ASSERT_TRUE(duplicate) << "page " << k << " re-cached";
      } else if (!duplicate) {
        Entry& e = model_.entries[prefix];  // New, or a host-only re-attach.
        e.device = pages[k];
        e.len = end - k * kP;
      } else {
        // The tree holds these tokens inside a longer node's page.
        ASSERT_LT(end - k * kP, kP) << "full page " << k << " missing";
      }
    }
    if (r->node != kNoNode) recent_.push_back(r->node);
  }

  void DoBackup() {
    if (recent_.empty()) return;
    const NodeId id = recent_[rng_() % recent_.size()];
    auto info = tree_->Inspect(id);
    if (!info.ok() || info->tier != NodeTier::kDevice || info->pending_backup) {
      return;
    }
    std::vector<std::vector<int64_t>> host(cp_);
    for (Rank owner : info->page_owners) host[owner].push_back(next_host_++);
    auto meta = CpHostMeta::Create(info->len, kP, cp_, info->page_owners, host);
    ASSERT_TRUE(meta.ok());
    ASSERT_TRUE(tree_->BeginBackup(id, *meta).ok());
    pending_.push_back({id, *meta});
  }

  void FinishBackup() {
    if (pending_.empty()) return;
    const size_t i = rng_() % pending_.size();
    auto [id, meta] = pending_[i];
    pending_[i] = pending_.back();
    pending_.pop_back();
    if (rng_() % 4 == 0) {
      ASSERT_TRUE(tree_->AbortBackup(id).ok());
      return;
    }
    ASSERT_TRUE(tree_->CommitBackup(id).ok());
    auto info = *tree_->Inspect(id);
    std::vector<size_t> next(cp_, 0);
    for (size_t i = 0; i < info.device_pages.size(); ++i) {
      Entry* e = model_.FindByDevicePage(info.device_pages[i]);
      ASSERT_NE(e, nullptr);
      const Rank owner = meta.page_owners()[i];
      e->host = {owner, meta.host_pages(owner)[next[owner]++]};
    }
  }

  void DoEvictDevice() {
    ASSERT_NO_FATAL_FAILURE(
        ApplyDeviceEviction(tree_->EvictDeviceTokens(1 + rng_() % 24)));
  }

  // Owner-lane eviction. Its contract, checked from the outside: it never
  // takes a locked node or one with a backup in flight, and a lane it leaves
  // short has no device page that evicting more could free -- each one lies
  // in a locked subtree or above a backup in flight (ancestors included:
  // evicting children to reach an ancestor's pages is part of the job).
  void DoEvictDeviceLanes() {
    std::vector<int64_t> need(cp_);
    for (auto& n : need) n = rng_() % 3 == 0 ? 0 : rng_() % 4;
    std::set<LogicalPage> protected_pages;
    const std::map<NodeId, NodeInfo> before = DeviceNodes();
    for (const auto& [id, info] : before) {
      if (info.lock_ref > 0 || info.pending_backup) {
        protected_pages.insert(info.device_pages.begin(),
                               info.device_pages.end());
      }
    }
    DeviceEvictResult e = tree_->EvictDevice(need);
    last_op_ = "evict lanes";
    for (int64_t n : need) last_op_ += " " + std::to_string(n);
    last_op_ += "\ndevice nodes before:\n";
    for (const auto& [id, info] : before) {
      last_op_ += "  id " + std::to_string(id) + " parent " +
                  std::to_string(info.parent) + " lock " +
                  std::to_string(info.lock_ref) + " pending " +
                  std::to_string(info.pending_backup) + " pages";
      for (auto p : info.device_pages) last_op_ += " " + std::to_string(p);
      last_op_ += "\n";
    }
    for (Rank lane = 0; lane < cp_; ++lane) {
      for (LogicalPage p : e.freed_pages[lane]) {
        ASSERT_EQ(protected_pages.count(p), 0u)
            << "evicted protected page " << p << "\n"
            << last_op_;
      }
    }
    ASSERT_NO_FATAL_FAILURE(ApplyDeviceEviction(e));
    // What is left: nodes that cannot go (locked, or at or above a backup in
    // flight).
    const std::map<NodeId, NodeInfo> nodes = DeviceNodes();
    std::set<NodeId> stuck;
    for (const auto& [id, info] : nodes) {
      if (info.lock_ref == 0 && !info.pending_backup) continue;
      for (NodeId n = id; nodes.count(n) > 0; n = nodes.at(n).parent) {
        stuck.insert(n);
      }
    }
    for (Rank lane = 0; lane < cp_; ++lane) {
      if (static_cast<int64_t>(e.freed_pages[lane].size()) >= need[lane]) {
        continue;
      }
      for (const auto& [id, info] : nodes) {
        if (stuck.count(id) > 0) continue;
        for (LogicalPage p : info.device_pages) {
          ASSERT_NE(p % cp_, lane)
              << "lane " << lane << " left short (freed "
              << e.freed_pages[lane].size() << " of " << need[lane]
              << ") while node " << id << " could still free page " << p << "\n"
              << last_op_ << "\nafter:\n"
              << DebugTree();
        }
      }
    }
    ++lane_evictions_;
  }

  // Every node on device, by id, with its pages.
  std::map<NodeId, NodeInfo> DeviceNodes() {
    std::map<NodeId, NodeInfo> nodes;
    for (const NodeInfo& n : tree_->Dump({})) {
      NodeInfo detail = *tree_->Inspect(n.id);
      if (!detail.device_pages.empty()) nodes[n.id] = std::move(detail);
    }
    return nodes;
  }

  void ApplyDeviceEviction(const DeviceEvictResult& e) {
    for (Rank lane = 0; lane < cp_; ++lane) {
      for (LogicalPage p : e.freed_pages[lane]) {
        ASSERT_EQ(p % cp_, lane);
        Entry* entry = model_.FindByDevicePage(p);
        ASSERT_NE(entry, nullptr);
        entry->device = -1;
      }
    }
    for (Rank r = 0; r < cp_; ++r) {
      for (int64_t hp : e.freed_host_pages[r]) {
        ASSERT_NO_FATAL_FAILURE(model_.EraseHost(r, hp));
      }
    }
    // Unbacked evicted entries are gone entirely.
    for (auto it = model_.entries.begin(); it != model_.entries.end();) {
      if (it->second.device < 0 && it->second.host.second < 0) {
        it = model_.entries.erase(it);
      } else {
        ++it;
      }
    }
  }

  void DoEvictHost() {
    std::vector<int64_t> need(cp_);
    for (auto& n : need) n = rng_() % 6;
    HostEvictResult h = tree_->EvictHost(need);
    for (Rank r = 0; r < cp_; ++r) {
      for (int64_t hp : h.freed_host_pages[r]) {
        ASSERT_NO_FATAL_FAILURE(model_.EraseHost(r, hp));
      }
    }
  }

  void DoLockToggle() {
    if (!locked_.empty() && rng_() % 2 == 0) {
      ASSERT_TRUE(tree_->Unlock(locked_.back()).ok());
      locked_.pop_back();
    } else if (!recent_.empty()) {
      const NodeId id = recent_[rng_() % recent_.size()];
      if (tree_->Inspect(id).ok() && locked_.size() < 4) {
        ASSERT_TRUE(tree_->Lock(id).ok());
        locked_.push_back(id);
      }
    }
  }

  std::set<LogicalPage> TreeDevicePages() {
    std::set<LogicalPage> pages;
    for (const NodeInfo& n : tree_->Dump({})) {
      const NodeInfo detail = *tree_->Inspect(n.id);
      pages.insert(detail.device_pages.begin(), detail.device_pages.end());
    }
    return pages;
  }

  std::string DebugTree() {
    std::string out;
    for (const NodeInfo& n : tree_->Dump({})) {
      auto detail = *tree_->Inspect(n.id);
      out += "  id " + std::to_string(n.id) + " parent " +
             std::to_string(n.parent) + " len " + std::to_string(n.len) +
             " lock " + std::to_string(n.lock_ref) + " head";
      for (auto t : n.head_tokens) out += " " + std::to_string(t);
      out += " pages";
      for (auto p : detail.device_pages) out += " " + std::to_string(p);
      out += "\n";
    }
    return out;
  }
  std::string last_op_;

  // The tree and the model side by side, for failure messages.
  std::string DebugString() {
    std::string out = last_op_ + "\ntree:\n";
    for (const NodeInfo& n : tree_->Dump({})) {
      auto detail = *tree_->Inspect(n.id);
      out += "  id " + std::to_string(n.id) + " parent " +
             std::to_string(n.parent) + " start " + std::to_string(n.start) +
             " len " + std::to_string(n.len) + " tier " +
             std::to_string(static_cast<int>(n.tier)) + " pending " +
             std::to_string(n.pending_backup) + " pages";
      for (auto p : detail.device_pages) out += " " + std::to_string(p);
      out += "\n";
    }
    out += "model:\n";
    for (const auto& [key, e] : model_.entries) {
      out += "  len " + std::to_string(key.size()) + " dev " +
             std::to_string(e.device) + " host " +
             std::to_string(e.host.second) + " +" + std::to_string(e.len) +
             "\n";
    }
    return out;
  }

  uint32_t cp_ = 2;  // C, per test: GetParam().second.
  std::mt19937_64 rng_;
  FakeClock clock_{absl::FromUnixSeconds(1)};
  testing::TierRecorder tiers_{kBlock, kHashSeed};
  std::unique_ptr<RadixTree> tree_;
  Model model_;
  std::vector<std::vector<int32_t>> bases_;
  std::vector<NodeId> recent_;
  std::vector<NodeId> locked_;
  std::vector<std::pair<NodeId, CpHostMeta>> pending_;
  LogicalPage next_page_ = 1000;
  int64_t next_host_ = 0;
  int64_t deferred_ = 0;
  int64_t lane_evictions_ = 0;
};

TEST_P(RadixModelTest, MatchesNaiveReference) {
  for (int step = 0; step < 100000; ++step) {
    clock_.Advance(absl::Milliseconds(1));
    const int op = rng_() % 100;
    if (op < 30) {
      ASSERT_NO_FATAL_FAILURE(DoInsert());
    } else if (op < 50) {
      ASSERT_NO_FATAL_FAILURE(CheckMatch(RandomKey()));
    } else if (op < 60) {
      ASSERT_NO_FATAL_FAILURE(DoBackup());
    } else if (op < 70) {
      ASSERT_NO_FATAL_FAILURE(FinishBackup());
    } else if (op < 80) {
      ASSERT_NO_FATAL_FAILURE(DoEvictDevice());
    } else if (op < 85) {
      ASSERT_NO_FATAL_FAILURE(DoEvictDeviceLanes());
    } else if (op < 92) {
      ASSERT_NO_FATAL_FAILURE(DoEvictHost());
    } else {
      ASSERT_NO_FATAL_FAILURE(DoLockToggle());
    }
    // The full page-set comparison walks the whole tree: every 10 steps (the
    // invariant checker and the counters run after every step).
    if (step % 10 == 0) {
      ASSERT_EQ(TreeDevicePages(), model_.DevicePages())
          << "step " << step << " op " << op << "\n"
          << DebugString();
      ASSERT_TRUE(tiers_.errors.empty())
          << "step " << step << ": " << tiers_.errors.front() << "\n"
          << DebugString();
      ASSERT_EQ(tiers_.held, model_.Announced())
          << "step " << step << " op " << op << "\n"
          << DebugString();
    }
    if (recent_.size() > 64)
      recent_.erase(recent_.begin(), recent_.begin() + 32);
    ASSERT_TRUE(tree_->CheckInvariants().ok())
        << "step " << step << ": " << tree_->CheckInvariants() << "\n"
        << DebugString();
    const TreeStats stats = tree_->Stats();
    ASSERT_EQ(stats.device_tokens, model_.DeviceTokens())
        << "step " << step << "\n"
        << DebugString();
    ASSERT_EQ(stats.host_tokens, model_.HostTokens()) << "step " << step << "\n"
                                                      << DebugString();
  }
  RecordProperty("deferred_inserts", static_cast<int>(deferred_));
  EXPECT_GT(tiers_.stores[static_cast<int>(Tier::kDevice)], 0);
  EXPECT_GT(tiers_.stores[static_cast<int>(Tier::kHost)], 0);
  EXPECT_GT(lane_evictions_, 0);
}

INSTANTIATE_TEST_SUITE_P(Seeds, RadixModelTest,
                         ::testing::Values(std::pair<uint64_t, uint32_t>{1, 2},
                                           std::pair<uint64_t, uint32_t>{2, 2},
                                           std::pair<uint64_t, uint32_t>{3, 2},
                                           std::pair<uint64_t, uint32_t>{4, 2},
                                           std::pair<uint64_t, uint32_t>{5, 2},
                                           std::pair<uint64_t, uint32_t>{6, 4},
                                           std::pair<uint64_t, uint32_t>{7, 4},
                                           std::pair<uint64_t, uint32_t>{8, 4},
                                           std::pair<uint64_t, uint32_t>{9, 4},
                                           std::pair<uint64_t, uint32_t>{10,
                                                                         4}));

}  // namespace
}  // namespace hicache
