// Crash survival per write policy (issue 25, "hot restart under the
// default"): a C = 2 hicached with --state_dir serves conversation traffic
// under device and host pressure, with the write policy's own backup choice
// (BACKUP_CHOICE_AUTO, as a scheduler that does not override it). It is
// SIGKILLed with a request mid-flow (admitted, half its layers stored, never
// completed) once the host tier it had is durable. After the restart:
//   - every prefix that is a hit loads back byte-exact on both ranks (each
//     recovered page passed its checksum at recovery);
//   - the recovery report (GetStats persistence) accounts for what it
//     recovered and what it dropped, by reason;
//   - a policy that keeps the host tier prefix-closed (write_ahead, the
//     default, and write_through) serves at least 95% of the host tokens it
//     had. An exclusive tier (write_back) keeps cold suffixes whose
//     prefixes lived only on the device: recovery must drop them as
//     orphans, and this test prints how much survives.
// The figures line ("crash survival: ...") is what docs/hot-restart.md
// quotes. Nothing here waits on timing but Quiesce, which waits for the
// backups and the journal to settle (a condition, with a generous deadline).
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/integration/hot_restart_fixture.h"

namespace hicache::hot_restart {
namespace {

struct PolicyCase {
  std::string name;         // Test name suffix.
  std::string flag;         // --write_policy value; empty: the default.
  bool prefix_closed;       // The host tier it keeps survives a crash.
  bool copy_free;           // Never waits for a device-to-host copy.
};

void PrintTo(const PolicyCase& c, std::ostream* os) { *os << c.name; }

class CrashSurvivalTest : public HotRestartTest,
                          public ::testing::WithParamInterface<PolicyCase> {
 protected:
  // One turn as a scheduler runs it: load back what the host tier has,
  // admit with the policy's backup choice, write the new pages' KV, store
  // every layer of a backup Admit prepared, complete.
  void Turn(const std::vector<int32_t>& tokens) {
    const int64_t cached = CachedTokens(tokens);
    if (cached > 0) {
      const std::vector<int32_t> prefix(tokens.begin(),
                                        tokens.begin() + cached);
      // The device pool may be held by copies still in flight: then the
      // load is short (verified as far as it went) and the turn is skipped,
      // as a scheduler would retry it.
      bool complete = false;
      ASSERT_NO_FATAL_FAILURE(LoadAndVerify(prefix, &complete));
      if (!complete) {
        ++short_loads_;
        return;
      }
    }
    auto admitted = session_->Admit({client::MakeAdmitItem(
        tokens, 0, v1::COMPUTE_OWNER_MODE_ROUND_ROBIN, v1::BACKUP_CHOICE_AUTO)});
    ASSERT_TRUE(admitted.ok()) << admitted.status();
    const v1::AdmitResult& a = admitted->results(0);
    if (!a.admitted() || a.load()) {
      // Evicted between the load and the admit: skip this turn.
      if (a.lock_handle() != 0) {
        ASSERT_TRUE(session_->UnlockHandles({a.lock_handle()}).ok());
      }
      return;
    }
    std::vector<int64_t> pages(a.device().pages().begin(),
                               a.device().pages().end());
    pages.insert(pages.end(), a.pages().begin(), a.pages().end());
    ASSERT_EQ(pages.size() * page_size_, tokens.size());
    ASSERT_NO_FATAL_FAILURE(WriteKv(tokens, pages, a.device().pages_size()));
    if (a.backup_id() != 0) {
      for (uint32_t step = 0; step < layout_.num_steps(); ++step) {
        ASSERT_TRUE(backups_->LayerStored({a.backup_id()}, step).ok());
      }
    }
    auto completed =
        session_->Complete({client::MakeCompleteItem(a, tokens, page_size_)});
    ASSERT_TRUE(completed.ok()) << completed.status();
  }

  int short_loads_ = 0;  // Turns skipped for a short load.

  // Waits until no attached backup is in flight and every host-tier change
  // reported is durable (the recorder has handled it and the journal has
  // synced it: a condition, not a time), and the journal file holds it.
  void Quiesce() {
    ASSERT_NO_FATAL_FAILURE(WaitJournalSettled(
        [](const v1::CacheStats& stats) {
          return stats.pending_backups() == 0 &&
                 stats.persistence().journal_backlog_events() == 0 &&
                 stats.persistence().journal_not_durable_records() == 0;
        },
        absl::Milliseconds(50), absl::Seconds(30)));
  }
};

TEST_P(CrashSurvivalTest, SigkillUnderConversationTrafficAtCp2) {
  const PolicyCase& c = GetParam();
  constexpr uint32_t kCp = 2;
  std::vector<std::string> flags = Flags(kCp);
  if (!c.flag.empty()) flags.push_back("--write_policy=" + c.flag);
  ASSERT_NO_FATAL_FAILURE(Start(flags));

  // Conversations: 24 slots; each turn either extends its slot's session by
  // 1-2 pages or (every 4th turn of a slot) starts a new one: one of 3
  // system prompts (2 pages, shared: hot on the device) and 2-4 pages of its
  // own. Tokens are unique per page start, so the KV pattern names its
  // prefix. The pools hold 64 device and 128 host pages: this evicts from
  // both.
  constexpr int kSlots = 24;
  constexpr int kTurns = 720;
  int32_t next_token = 1000;
  auto fresh = [&](int pages) {
    std::vector<int32_t> t =
        Tokens(next_token, pages, static_cast<uint32_t>(page_size_));
    next_token += pages * static_cast<int32_t>(page_size_);
    return t;
  };
  const std::vector<std::vector<int32_t>> system = {fresh(2), fresh(2),
                                                    fresh(2)};
  std::vector<std::vector<int32_t>> session(kSlots);
  std::vector<std::vector<int32_t>> issued;
  for (int i = 0; i < kTurns; ++i) {
    const int slot = (i * 7) % kSlots;
    const int turn = i / kSlots;
    if (session[slot].empty() || (turn + slot) % 4 == 0) {
      session[slot] = Concat(system[i % 3], fresh(2 + (i + slot) % 3));
    } else {
      session[slot] = Concat(session[slot], fresh(1 + i % 2));
    }
    issued.push_back(session[slot]);
    ASSERT_NO_FATAL_FAILURE(Turn(session[slot])) << "turn " << i;
  }
  // Short loads are the exception, not the run.
  EXPECT_LT(short_loads_, kTurns / 4);

  // Mid-flow at the kill: admitted, half the layers of its backup stored (if
  // the policy prepared one), never completed.
  auto midflow = session_->Admit({client::MakeAdmitItem(
      fresh(3), 0, v1::COMPUTE_OWNER_MODE_ROUND_ROBIN, v1::BACKUP_CHOICE_AUTO)});
  ASSERT_TRUE(midflow.ok()) << midflow.status();
  const v1::AdmitResult& m = midflow->results(0);
  ASSERT_TRUE(m.admitted()) << m.DebugString();
  if (m.backup_id() != 0) {
    for (uint32_t step = 0; step < layout_.num_steps() / 2; ++step) {
      ASSERT_TRUE(backups_->LayerStored({m.backup_id()}, step).ok());
    }
  }
  // Its backup is not attached (the request never completed): not pending.
  ASSERT_NO_FATAL_FAILURE(Quiesce());
  const v1::CacheStats before = Stats();
  ASSERT_GT(before.device_evicted_pages(), 0) << "no device pressure";
  if (c.copy_free) {
    EXPECT_EQ(before.copy_waits(), 0);
  }
  const int64_t host_before = before.host_tokens();
  ASSERT_GT(host_before, 0);
  ASSERT_NO_FATAL_FAILURE(Stop(SIGKILL, 128 + SIGKILL));

  ASSERT_NO_FATAL_FAILURE(Start(flags));
  const v1::CacheStats after = Stats();
  const v1::HostTierPersistence& p = after.persistence();
  ASSERT_TRUE(p.recovered()) << p.DebugString();
  EXPECT_EQ(p.dropped_checksum(), 0) << p.DebugString();
  EXPECT_EQ(p.dropped_conflict(), 0) << p.DebugString();
  EXPECT_EQ(p.pages_recovered() * page_size_, after.host_tokens())
      << p.DebugString();
  EXPECT_EQ(DevicePagesAllocated(), 0);
  const int64_t host_after = after.host_tokens();
  std::fprintf(stderr,
               "crash survival: write policy %s, C = %u: host tokens %lld "
               "before the kill, %lld recovered (%.1f%%); %lld nodes "
               "recovered, dropped %lld (parent gone) %lld (checksum) %lld "
               "(conflict); %lld copy waits, %lld host pages evicted\n",
               c.flag.empty() ? "default" : c.flag.c_str(), kCp,
               static_cast<long long>(host_before),
               static_cast<long long>(host_after),
               100.0 * static_cast<double>(host_after) /
                   static_cast<double>(host_before),
               static_cast<long long>(p.nodes_recovered()),
               static_cast<long long>(p.dropped_orphan()),
               static_cast<long long>(p.dropped_checksum()),
               static_cast<long long>(p.dropped_conflict()),
               static_cast<long long>(before.copy_waits()),
               static_cast<long long>(before.host_evicted_pages()));
  if (c.prefix_closed) {
    EXPECT_GE(host_after * 100, host_before * 95)
        << host_after << " of " << host_before << " host tokens; "
        << p.DebugString() << "before the kill:\n"
        << before.persistence().DebugString();
    EXPECT_EQ(p.dropped_orphan(), 0) << p.DebugString();
  } else {
    // Whatever an exclusive tier loses is reported, not silently gone.
    EXPECT_LE(host_after, host_before);
    if (host_after < host_before) {
      EXPECT_GT(p.dropped_orphan(), 0) << p.DebugString();
    }
  }

  // Every hit loads back byte-exact on both ranks; the most recent prefixes
  // first (an earlier one may be a prefix of a later one: a device hit then).
  int64_t served = 0;
  for (auto it = issued.rbegin(); it != issued.rend(); ++it) {
    const int64_t hit = CachedTokens(*it);
    ASSERT_EQ(hit % page_size_, 0);
    if (hit == 0) continue;
    const std::vector<int32_t> prefix(it->begin(), it->begin() + hit);
    ASSERT_NO_FATAL_FAILURE(LoadAndVerify(prefix));
    served += hit;
  }
  if (host_after > 0) {
    EXPECT_GT(served, 0);
  }
  // The recovered cache takes new traffic.
  ASSERT_NO_FATAL_FAILURE(Turn(Concat(issued.back(), fresh(1))));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
}

INSTANTIATE_TEST_SUITE_P(
    WritePolicies, CrashSurvivalTest,
    ::testing::Values(
        // The default is write_ahead (docs/eviction.md).
        PolicyCase{"Default", "", /*prefix_closed=*/true,
                   /*copy_free=*/true},
        PolicyCase{"WriteBack", "write_back", false, false},
        PolicyCase{"WriteThrough", "write_through", true, true},
        PolicyCase{"WriteThroughSelective", "write_through_selective", false,
                   true},
        PolicyCase{"WriteAhead", "write_ahead", true, true}),
    [](const ::testing::TestParamInfo<PolicyCase>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace hicache::hot_restart
