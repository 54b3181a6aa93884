#include "tests/integration/hot_restart_fixture.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "tests/testing/daemon_process.h"

namespace hicache::hot_restart {

using testing::Subprocess;
std::vector<int32_t> Tokens(int32_t base, int pages, uint32_t page_size) {
  std::vector<int32_t> tokens(pages * page_size);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = base + i;
  return tokens;
}

std::vector<int32_t> Concat(std::vector<int32_t> a,
                            const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The KV byte of a page: a function of the page's first token (the tokens
// are distinct per prefix, so this stands for "the whole prefix"), the
// page's position, the (family, layer) block and the byte in it.
uint8_t Pattern(int32_t first_token, int64_t position, int family,
                uint32_t layer, uint64_t byte) {
  const uint64_t h = static_cast<uint64_t>(first_token) * 0x9E3779B97F4A7C15u;
  return static_cast<uint8_t>((h >> 29) + position * 131 + family * 31 +
                              layer * 7 + byte * 13 + 1);
}

// Entries of /dev/shm whose name starts with `prefix`.
std::vector<std::string> ShmEntries(const std::string& prefix) {
  std::vector<std::string> names;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return names;
  while (dirent* entry = readdir(dir)) {
    if (absl::StartsWith(entry->d_name, prefix)) {
      names.push_back(entry->d_name);
    }
  }
  closedir(dir);
  return names;
}

int64_t FileSize(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

std::string ShmPath(const std::string& name) {
  return absl::StartsWith(name, "/") ? "/dev/shm" + name : "/dev/shm/" + name;
}

// `flags` with the flag `name` (e.g. "--page_size") set to `value`, or
// removed when `value` is empty.
std::vector<std::string> WithFlag(std::vector<std::string> flags,
                                  const std::string& name,
                                  const std::string& value) {
  std::vector<std::string> out;
  for (std::string& flag : flags) {
    if (!absl::StartsWith(flag, name + "=")) out.push_back(std::move(flag));
  }
  if (!value.empty()) out.push_back(name + "=" + value);
  return out;
}

HotRestartTest::~HotRestartTest() {
  Disconnect();
  daemon_.reset();  // SIGKILLs a daemon a failed test left running.
  // This instance's segments ("hicache-<instance>-...") and lock file
  // ("hicache-<instance>.lock"), not those of an instance it prefixes.
  for (const std::string& name : ShmEntries("hicache-" + instance_)) {
    const std::string rest = name.substr(("hicache-" + instance_).size());
    if (absl::StartsWith(rest, "-") || rest == ".lock") {
      unlink(("/dev/shm/" + name).c_str());
    }
  }
}

std::vector<std::string> HotRestartTest::Flags(uint32_t cp,
                                               uint32_t page_size) {
  return {"--socket=" + socket_,
          "--instance=" + instance_,
          "--state_dir=" + state_dir_,
          absl::StrCat("--cp_size=", cp),
          absl::StrCat("--page_size=", page_size),
          "--kv_preset=tiny",
          "--device_pages_per_rank=32",
          "--host_pages_per_rank=64",
          "--recovery_threads=2",
          "--log_level=info"};
}

void HotRestartTest::Start(const std::vector<std::string>& flags,
                           const std::string& binary) {
  std::vector<std::string> argv = {binary};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto daemon = Subprocess::Start(argv);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  daemon_ = std::make_unique<Subprocess>(*std::move(daemon));
  auto stub = testing::AwaitDaemon(*daemon_, socket_, absl::Seconds(15));
  ASSERT_TRUE(stub.ok()) << stub.status();
  stub_ = *std::move(stub);
  ASSERT_NO_FATAL_FAILURE(Connect());
}

void HotRestartTest::Connect() {
  auto session =
      client::Session::Open(stub_, "hot-restart", v1::ROLE_SCHEDULER, 0, "");
  ASSERT_TRUE(session.ok()) << session.status();
  session_ = *std::move(session);
  auto layout = session_->GetLayout();
  ASSERT_TRUE(layout.ok()) << layout.status();
  layout_ = *layout;
  cp_ = layout_.geometry().cp_size();
  page_size_ = layout_.geometry().page_size_tokens();
  device_.clear();
  for (const v1::RankSegments& rank : layout_.ranks()) {
    ASSERT_EQ(rank.rank(), device_.size());
    auto mapped = client::MappedSegment::Map(rank.device());
    ASSERT_TRUE(mapped.ok()) << mapped.status();
    device_.push_back(*std::move(mapped));
  }
  ASSERT_EQ(device_.size(), cp_);
  auto stream = session_->OpenBackupStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  backups_ = *std::move(stream);
  const v1::CacheStats stats = Stats();
  committed_ = stats.backups_committed();
  // The daemon wrote (and synced) the journal it starts from before serving.
  journal_bytes_ = stats.persistence().journal_file_bytes();
}

void HotRestartTest::Disconnect() {
  if (backups_ != nullptr) backups_->Cancel();
  backups_.reset();
  session_.reset();
  device_.clear();
}

void HotRestartTest::Stop(int signal, int code) {
  if (signal == SIGTERM && session_ != nullptr) {
    EXPECT_TRUE(backups_->Close().ok());
    EXPECT_TRUE(session_->Close().ok());
    // An idle open channel holds the daemon's SIGTERM for its whole
    // --shutdown_grace_seconds (see DISABLED_BUG_... below): drop it.
    Disconnect();
    stub_.reset();
  }
  ASSERT_TRUE(daemon_->Signal(signal).ok());
  auto exited = daemon_->Wait(absl::Seconds(15));
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_EQ(*exited, code) << daemon_->Stderr();
  Disconnect();
}

v1::CacheStats HotRestartTest::Stats() {
  grpc::ClientContext ctx;
  v1::CacheStats stats;
  EXPECT_TRUE(stub_->Stats(&ctx, v1::GetStatsRequest(), &stats).ok());
  return stats;
}

uint8_t* HotRestartTest::Block(int64_t page, int family, uint32_t layer) {
  const uint32_t owner = page % cp_;
  if (page < 0 || owner >= device_.size()) {
    ADD_FAILURE() << "page " << page << " has no segment";
    return nullptr;
  }
  const uint64_t offset =
      client::DeviceBlockOffset(layout_, page / cp_, family, layer);
  if (offset + client::BlockBytes(layout_, family) > device_[owner]->size()) {
    ADD_FAILURE() << "page " << page << " lies past its segment";
    return nullptr;
  }
  return device_[owner]->data() + offset;
}

void HotRestartTest::WriteKv(const std::vector<int32_t>& tokens,
                             const std::vector<int64_t>& pages, size_t from) {
  for (size_t k = from; k < pages.size(); ++k) {
    const int64_t page = pages[k];
    for (int f = 0; f < layout_.families_size(); ++f) {
      for (uint32_t l = 0; l < layout_.families(f).num_layers(); ++l) {
        uint8_t* block = Block(page, f, l);
        ASSERT_NE(block, nullptr);
        for (uint64_t b = 0; b < client::BlockBytes(layout_, f); ++b) {
          block[b] = Pattern(tokens[k * page_size_], k, f, l, b);
        }
      }
    }
  }
}

void HotRestartTest::VerifyKv(const std::vector<int32_t>& tokens,
                              const std::vector<int64_t>& pages) {
  ASSERT_EQ(pages.size() * page_size_, tokens.size());
  std::vector<int> checked(cp_, 0);
  for (size_t k = 0; k < pages.size(); ++k) {
    const int64_t page = pages[k];
    ++checked[page % cp_];
    for (int f = 0; f < layout_.families_size(); ++f) {
      for (uint32_t l = 0; l < layout_.families(f).num_layers(); ++l) {
        const uint8_t* block = Block(page, f, l);
        ASSERT_NE(block, nullptr);
        for (uint64_t b = 0; b < client::BlockBytes(layout_, f); ++b) {
          ASSERT_EQ(block[b], Pattern(tokens[k * page_size_], k, f, l, b))
              << "position " << k << " page " << page << " family " << f
              << " layer " << l << " byte " << b;
        }
      }
    }
  }
  if (pages.size() >= cp_ && cp_ > 1) {
    for (uint32_t r = 0; r < cp_; ++r) {
      EXPECT_GT(checked[r], 0) << "no page on rank " << r;
    }
  }
}

uint64_t HotRestartTest::Request(const std::vector<int32_t>& tokens,
                                 int steps) {
  const bool all = steps < 0;
  if (all) steps = static_cast<int>(layout_.num_steps());
  auto admitted = session_->Admit(
      {client::MakeAdmitItem(tokens, 0, v1::COMPUTE_OWNER_MODE_ROUND_ROBIN,
                             v1::BACKUP_CHOICE_ALWAYS)});
  EXPECT_TRUE(admitted.ok()) << admitted.status();
  if (!admitted.ok()) return 0;
  const v1::AdmitResult& a = admitted->results(0);
  EXPECT_TRUE(a.admitted() && !a.load()) << a.DebugString();
  EXPECT_NE(a.backup_id(), 0u) << a.DebugString();
  std::vector<int64_t> pages(a.device().pages().begin(),
                             a.device().pages().end());
  pages.insert(pages.end(), a.pages().begin(), a.pages().end());
  EXPECT_EQ(pages.size() * page_size_, tokens.size());
  WriteKv(tokens, pages, a.device().pages_size());
  for (int step = 0; step < steps; ++step) {
    EXPECT_TRUE(backups_->LayerStored({a.backup_id()}, step).ok());
  }
  auto completed =
      session_->Complete({client::MakeCompleteItem(a, tokens, page_size_)});
  EXPECT_TRUE(completed.ok()) << completed.status();
  if (!completed.ok()) return 0;
  const v1::InsertResult& r = completed->results(0);
  EXPECT_FALSE(r.deferred());
  EXPECT_TRUE(r.backup_attached());
  if (all) {
    ++committed_;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (Stats().backups_committed() < committed_ && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_EQ(Stats().backups_committed(), committed_);
  }
  return r.node();
}

bool HotRestartTest::TryRequest(const std::vector<int32_t>& tokens) {
  auto admitted = session_->Admit(
      {client::MakeAdmitItem(tokens, 0, v1::COMPUTE_OWNER_MODE_ROUND_ROBIN,
                             v1::BACKUP_CHOICE_ALWAYS)});
  if (!admitted.ok() || admitted->results_size() != 1) return false;
  const v1::AdmitResult& a = admitted->results(0);
  if (!a.admitted() || a.load()) {
    if (a.lock_handle() != 0) (void)session_->UnlockHandles({a.lock_handle()});
    return false;
  }
  std::vector<int64_t> pages(a.device().pages().begin(),
                             a.device().pages().end());
  pages.insert(pages.end(), a.pages().begin(), a.pages().end());
  if (pages.size() * page_size_ != tokens.size()) return false;
  WriteKv(tokens, pages, a.device().pages_size());
  if (a.backup_id() != 0) {
    for (uint32_t step = 0; step < layout_.num_steps(); ++step) {
      if (!backups_->LayerStored({a.backup_id()}, step).ok()) return false;
    }
  }
  auto completed =
      session_->Complete({client::MakeCompleteItem(a, tokens, page_size_)});
  return completed.ok();
}

void HotRestartTest::WaitJournal(int64_t puts) {
  ASSERT_NO_FATAL_FAILURE(WaitJournalSettled(
      [&](const v1::CacheStats& stats) {
        return stats.persistence().journal_puts() >= puts &&
               stats.persistence().journal_file_bytes() > journal_bytes_;
      },
      // A generous bound: the journal's threads run at low priority (nice
      // 10), so on a busy machine they take a while.
      absl::Milliseconds(30), absl::Seconds(120), &journal_bytes_));
}

void HotRestartTest::WaitJournalSettled(
    const std::function<bool(const v1::CacheStats&)>& ready,
    absl::Duration period, absl::Duration timeout, uint64_t* settled_bytes) {
  const std::string journal = state_dir_ + "/journal";
  const absl::Time deadline = absl::Now() + timeout;
  uint64_t last = 0;
  int stable = 0;
  while (absl::Now() < deadline) {
    const v1::CacheStats stats = Stats();
    const uint64_t bytes = stats.persistence().journal_file_bytes();
    // Everything reported is durable: handled by the recorder and synced.
    const bool durable =
        stats.persistence().journal_backlog_events() == 0 &&
        stats.persistence().journal_not_durable_records() == 0;
    if (ready(stats) && durable &&
        static_cast<int64_t>(bytes) == FileSize(journal) && bytes == last) {
      if (++stable >= 3) {
        if (settled_bytes != nullptr) *settled_bytes = bytes;
        return;
      }
    } else {
      stable = 0;
    }
    last = bytes;
    absl::SleepFor(period);
  }
  FAIL() << "the journal (or what it waits for) did not settle: "
         << Stats().DebugString();
}

void HotRestartTest::Inspect(uint64_t node, v1::NodeInfo* info) {
  grpc::ClientContext ctx;
  v1::InspectNodeRequest request;
  request.set_node(node);
  const grpc::Status status = stub_->InspectNode(&ctx, request, info);
  ASSERT_TRUE(status.ok()) << status.error_message();
}

std::optional<v1::MatchResult> HotRestartTest::PeekMatch(
    const std::vector<int32_t>& tokens) {
  client::MatchOptions options;
  options.peek = true;
  auto match = session_->MatchPrefix({tokens}, options);
  EXPECT_TRUE(match.ok()) << match.status();
  if (!match.ok()) return std::nullopt;
  return match->results(0);
}

int64_t HotRestartTest::HostHit(const std::vector<int32_t>& tokens) {
  const std::optional<v1::MatchResult> match = PeekMatch(tokens);
  return match ? match->host_hit_tokens() : -1;
}

int64_t HotRestartTest::CachedTokens(const std::vector<int32_t>& tokens) {
  const std::optional<v1::MatchResult> match = PeekMatch(tokens);
  return match ? match->device().valid_tokens() + match->host_hit_tokens() : 0;
}

void HotRestartTest::LoadAndVerify(const std::vector<int32_t>& tokens,
                                   bool* complete) {
  auto loaded = session_->LoadBack(tokens);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->ok())
      << loaded->started.DebugString() << loaded->done.DebugString();
  // What an earlier load of this test put on the device is a device hit.
  const int64_t got =
      loaded->started.device_tokens() + loaded->started.loaded_tokens();
  const bool all = got == static_cast<int64_t>(tokens.size());
  if (complete != nullptr) {
    *complete = all;
    if (!all) {
      ASSERT_EQ(loaded->started.miss_reason(), "no_device_memory")
          << loaded->started.DebugString();
    }
  } else {
    ASSERT_TRUE(all) << loaded->started.DebugString();
  }
  const auto& proto = loaded->started.locations().pages();
  const std::vector<int64_t> pages(proto.begin(), proto.end());
  ASSERT_NO_FATAL_FAILURE(
      VerifyKv(std::vector<int32_t>(tokens.begin(), tokens.begin() + got),
               pages));
  if (loaded->lock_handle() != 0) {
    ASSERT_TRUE(session_->UnlockHandles({loaded->lock_handle()}).ok());
  }
}

int64_t HotRestartTest::DevicePagesAllocated() {
  int64_t allocated = 0;
  const v1::CacheStats stats = Stats();  // Not a temporary's lanes().
  for (const auto& lane : stats.lanes()) allocated += lane.allocated();
  return allocated;
}

std::vector<std::string> HotRestartTest::HostSegments() {
  return ShmEntries("hicache-" + instance_ + "-host-");
}

}  // namespace hicache::hot_restart
