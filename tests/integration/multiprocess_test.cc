// Multi-process integration: the real hicached, this test as the scheduler,
// and C worker processes (kv_agent) that map their rank's device segment,
// write the KV of the pages they own, and later verify what load-back brought
// back. Plus crash tests: SIGKILLed clients leave nothing behind.
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/cpp/hicache_session.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace hicache {
namespace {

using testing::Subprocess;

class MultiProcessTest : public ::testing::TestWithParam<uint32_t> {
 protected:
  void StartDaemon(uint32_t cp) {
    auto daemon = Subprocess::Start(
        {testing::RunfilePath("daemon/hicached"), "--socket=" + socket_,
         absl::StrCat("--cp_size=", cp), "--page_size=4",
         "--kv_preset=tiny-draft", "--device_pages_per_rank=16",
         "--host_pages_per_rank=32", "--default_lease_ms=2000",
         "--log_level=warn"});
    ASSERT_TRUE(daemon.ok());
    daemon_ = std::make_unique<Subprocess>(*std::move(daemon));
    auto stub = testing::AwaitDaemon(*daemon_, socket_, absl::Seconds(10));
    ASSERT_TRUE(stub.ok()) << stub.status();
    stub_ = *std::move(stub);
  }

  // Runs one kv_agent per rank and expects all to succeed.
  void RunWorkers(uint32_t cp, const std::string& mode,
                  const std::vector<int64_t>& pages) {
    std::vector<Subprocess> workers;
    for (uint32_t r = 0; r < cp; ++r) {
      auto worker = Subprocess::Start(
          {testing::RunfilePath("tests/integration/kv_agent"),
           "--socket=" + socket_, "--mode=" + mode, absl::StrCat("--rank=", r),
           "--pages=" + absl::StrJoin(pages, ",")});
      ASSERT_TRUE(worker.ok());
      workers.push_back(*std::move(worker));
    }
    for (Subprocess& w : workers) {
      auto code = w.Wait(absl::Seconds(30));
      ASSERT_TRUE(code.ok());
      EXPECT_EQ(*code, 0) << mode << ": " << w.Stderr();
    }
  }

  v1::CacheStats Stats() {
    grpc::ClientContext ctx;
    v1::CacheStats stats;
    EXPECT_TRUE(stub_->Stats(&ctx, v1::GetStatsRequest(), &stats).ok());
    return stats;
  }

  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("d.sock");
  std::unique_ptr<Subprocess> daemon_;
  std::shared_ptr<v1::HiCache::Stub> stub_;
};

TEST_P(MultiProcessTest, WorkersWriteBackUpLoadAndVerify) {
  const uint32_t cp = GetParam();
  ASSERT_NO_FATAL_FAILURE(StartDaemon(cp));
  auto session =
      client::Session::Open(stub_, "scheduler", v1::ROLE_SCHEDULER, 0, "");
  ASSERT_TRUE(session.ok()) << session.status();
  // A 10-page request with zigzag compute owners.
  v1::AllocateItem item;
  item.set_num_pages(10);
  item.set_mode(v1::COMPUTE_OWNER_MODE_ZIGZAG);
  auto allocation = (*session)->Allocate({item});
  ASSERT_TRUE(allocation.ok()) << allocation.status();
  const auto& proto_pages = allocation->allocations(0).pages();
  const std::vector<int64_t> pages(proto_pages.begin(), proto_pages.end());
  ASSERT_NO_FATAL_FAILURE(RunWorkers(cp, "write", pages));

  // Back up per layer, insert with the backup, wait for the commit.
  grpc::ClientContext backup_ctx;
  auto stream = stub_->BackupSession(&backup_ctx);
  v1::BackupClientMessage prepare;
  prepare.set_session_id((*session)->id());
  v1::BackupSpec* spec = prepare.mutable_prepare()->add_specs();
  spec->mutable_pages()->Add(pages.begin(), pages.end());
  spec->set_logical_tokens(40);
  ASSERT_TRUE(stream->Write(prepare));
  v1::BackupServerMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  const uint64_t backup = reply.prepared().backup_ids(0);
  ASSERT_NE(backup, 0u);
  auto layout = (*session)->GetLayout();
  for (uint32_t step = 0; step < layout->num_steps(); ++step) {
    v1::BackupClientMessage stored;
    stored.set_session_id((*session)->id());
    stored.mutable_layer_stored()->add_backup_ids(backup);
    stored.mutable_layer_stored()->set_step(step);
    ASSERT_TRUE(stream->Write(stored));
  }
  std::vector<int32_t> tokens(40);
  for (int i = 0; i < 40; ++i) tokens[i] = 1000 + i;
  v1::InsertRequest insert;
  insert.add_items()->set_tokens(client::PackTokens(tokens));
  insert.mutable_items(0)->mutable_pages()->Add(pages.begin(), pages.end());
  insert.mutable_items(0)->set_backup_id(backup);
  auto inserted = (*session)->Insert(insert);
  ASSERT_TRUE(inserted.ok()) << inserted.status();
  ASSERT_TRUE(inserted->results(0).backup_attached());
  int steps_done = 0;
  bool committed = false;
  while (!committed && stream->Read(&reply)) {
    steps_done += reply.has_step_done();
    committed = reply.has_committed();
  }
  ASSERT_TRUE(committed);
  EXPECT_EQ(steps_done, static_cast<int>(cp * layout->num_steps()));
  stream->WritesDone();
  ASSERT_TRUE(stream->Finish().ok());

  // Force device eviction, then load back over the stream.
  {
    grpc::ClientContext ctx;
    v1::EvictRequest evict;
    for (uint32_t r = 0; r < cp; ++r) evict.add_device_pages_per_lane(15);
    v1::EvictResponse evicted;
    ASSERT_TRUE(stub_->Evict(&ctx, evict, &evicted).ok());
    EXPECT_EQ(evicted.device_pages_freed(), 10);
  }
  grpc::ClientContext load_ctx;
  v1::LoadBackRequest load;
  load.set_session_id((*session)->id());
  load.set_tokens(client::PackTokens(tokens));
  auto events = stub_->LoadBack(&load_ctx, load);
  v1::LoadBackEvent event;
  ASSERT_TRUE(events->Read(&event));
  ASSERT_EQ(event.started().loaded_tokens(), 40) << event.DebugString();
  const auto& loaded_proto = event.started().locations().pages();
  const std::vector<int64_t> loaded(loaded_proto.begin(), loaded_proto.end());
  const uint64_t node = event.started().node();
  bool ok = false;
  while (events->Read(&event)) {
    if (event.has_done()) ok = event.done().ok();
  }
  ASSERT_TRUE(events->Finish().ok());
  ASSERT_TRUE(ok);
  // Same owner pattern, new pages: each worker verifies its own.
  for (size_t i = 0; i < pages.size(); ++i) {
    EXPECT_EQ(loaded[i] % cp, pages[i] % cp) << "page " << i;
  }
  ASSERT_NO_FATAL_FAILURE(RunWorkers(cp, "verify", loaded));
  ASSERT_TRUE((*session)->Unlock({node}).ok());
  ASSERT_TRUE((*session)->Close().ok());
  EXPECT_EQ(Stats().sessions(), 0);
  ASSERT_TRUE(daemon_->Signal(SIGTERM).ok());
  EXPECT_EQ(*daemon_->Wait(absl::Seconds(20)), 0);
}

INSTANTIATE_TEST_SUITE_P(CpSizes, MultiProcessTest, ::testing::Values(2u, 4u));

class CrashTest : public MultiProcessTest {};

TEST_F(CrashTest, KilledClientsLeaveNoLocksReservationsOrPages) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon(2));
  std::vector<Subprocess> agents;
  for (const char* mode : {"--mode=hold_scheduler", "--mode=hold_worker"}) {
    auto agent =
        Subprocess::Start({testing::RunfilePath("tests/integration/kv_agent"),
                           "--socket=" + socket_, mode, "--rank=1"});
    ASSERT_TRUE(agent.ok());
    agents.push_back(*std::move(agent));
  }
  for (Subprocess& agent : agents) {
    // A generous bound: the agents start as fast as the machine lets them.
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (agent.Stdout().find("READY") == std::string::npos) {
      ASSERT_TRUE(agent.Running()) << agent.Stderr();
      ASSERT_LT(absl::Now(), deadline) << "no READY: " << agent.Stderr();
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  v1::CacheStats held = Stats();
  EXPECT_EQ(held.sessions(), 2);
  EXPECT_GE(held.session_locks(), 1);
  EXPECT_EQ(held.session_pages(), 3);  // The backed-up, never inserted pages.
  for (Subprocess& agent : agents) {
    ASSERT_TRUE(agent.Signal(SIGKILL).ok());
    ASSERT_TRUE(agent.Wait(absl::Seconds(5)).ok());
  }
  // After the 2 s lease the daemon releases everything they held.
  v1::CacheStats after;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(60);
       absl::Now() < deadline;) {
    after = Stats();
    if (after.sessions() == 0) break;
    absl::SleepFor(absl::Milliseconds(25));
  }
  EXPECT_EQ(after.sessions(), 0);
  EXPECT_EQ(after.session_locks(), 0);
  EXPECT_EQ(after.session_pages(), 0);
  EXPECT_EQ(after.protected_tokens(), 0);
  EXPECT_EQ(after.pending_backups(), 0);
  int64_t allocated = 0, host_used = 0;
  for (const auto& lane : after.lanes()) {
    allocated += lane.allocated();
    host_used += lane.host_used();
  }
  // Only the cached request's 2 pages remain, held by the tree.
  EXPECT_EQ(allocated, 2);
  EXPECT_EQ(host_used, 0);  // The orphan backup's reservation was freed.
  // New sessions work normally.
  auto session =
      client::Session::Open(stub_, "after", v1::ROLE_SCHEDULER, 0, "");
  ASSERT_TRUE(session.ok());
  v1::AllocateItem item;
  item.set_num_pages(4);
  EXPECT_TRUE((*session)->Allocate({item}).ok());
  EXPECT_TRUE((*session)->Close().ok());
}

}  // namespace
}  // namespace hicache
