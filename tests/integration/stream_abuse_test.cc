// What a buggy or hostile client can do to the streams and the request
// calls of a real hicached process, each answered with a clear error and no
// change or leak:
//  * a worker's Subscribe stream cancelled, or its process killed, while
//    events flow, or left unread until its backlog overflows: the daemon
//    unsubscribes it, frees its stream slot (probed with
//    --max_streams_per_session: Stats and ListSessions count no streams) and
//    keeps serving the other workers;
//  * layer_stored with 100000 fences (repeated ranks, unknown ids), with
//    100000 backup ids, with a step past the last: refused, nothing copied;
//  * LoadBack with too many items or an absurd extend_tokens; Admit with an
//    absurd reserve_tokens; Complete naming another session's lock handle or
//    pages, or one handle twice: refused, nothing changed.
// The last section reproduces bugs found while writing these (each now a
// regression test).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/endpoint.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "tests/testing/binaries.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tokens.h"

namespace hicache {
namespace {

using testing::DaemonPath;
using ::testing::HasSubstr;
using testing::Pack;
using testing::Seq;
using testing::Subprocess;

constexpr int64_t kPage = 4;          // --page_size
constexpr uint32_t kCp = 2;           // --cp_size
constexpr uint32_t kSteps = 2;        // --kv_preset=tiny: 2 target layers.
constexpr int64_t kItemLimit = 4096;  // --max_items_per_request
constexpr int64_t kTokenLimit = int64_t{1} << 24;  // --max_tokens_per_request
constexpr int kMaxStreams = 2;                     // --max_streams_per_session
const char kNs[] = "abuse";

// The helper process of KilledSubscriberProcessFreesItsSlot (this binary,
// re-run with this test filter) reads its socket and session from these.
const char kHelperSocketEnv[] = "HICACHE_STREAM_ABUSE_SOCKET";
const char kHelperSessionEnv[] = "HICACHE_STREAM_ABUSE_SESSION";

// A channel with a connection of its own (no subchannel sharing), so one
// client's streams never ride on another's connection.
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& socket,
                                          grpc::ChannelArguments args = {}) {
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(client::UnixTarget(socket),
                                   grpc::InsecureChannelCredentials(), args);
}

void Deadline(grpc::ClientContext* context,
              absl::Duration timeout = absl::Seconds(20)) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

// The state a refused call must leave unchanged.
struct Snapshot {
  int64_t nodes = 0;
  int64_t device_tokens = 0;
  int64_t protected_tokens = 0;
  int64_t host_tokens = 0;
  int64_t pending_backups = 0;
  int64_t backups_started = 0;
  int64_t loads_started = 0;
  int64_t session_locks = 0;
  int64_t session_pages = 0;
  int64_t sessions = 0;
  uint64_t bytes_to_host = 0;
  uint64_t bytes_to_device = 0;
  int64_t allocated = 0;  // Device pages of every lane.
  bool operator==(const Snapshot&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Snapshot& s) {
  return os << "{nodes " << s.nodes << ", device_tokens " << s.device_tokens
            << ", protected_tokens " << s.protected_tokens << ", host_tokens "
            << s.host_tokens << ", pending_backups " << s.pending_backups
            << ", backups_started " << s.backups_started << ", loads_started "
            << s.loads_started << ", session_locks " << s.session_locks
            << ", session_pages " << s.session_pages << ", sessions "
            << s.sessions << ", bytes_to_host " << s.bytes_to_host
            << ", bytes_to_device " << s.bytes_to_device << ", allocated "
            << s.allocated << "}";
}

// A BackupSession stream: a reader thread collects the server's messages.
class BackupStream {
 public:
  BackupStream(v1::HiCache::Stub* stub, std::string session)
      : session_(std::move(session)) {
    stream_ = stub->BackupSession(&context_);
    reader_ = std::thread([this] {
      v1::BackupServerMessage message;
      while (stream_->Read(&message)) {
        std::lock_guard<std::mutex> lock(mu_);
        messages_.push_back(message);
        cv_.notify_all();
      }
      std::lock_guard<std::mutex> lock(mu_);
      ended_ = true;
      cv_.notify_all();
    });
  }
  ~BackupStream() {
    if (!finished_) {
      context_.TryCancel();
      reader_.join();
      (void)stream_->Finish();
    }
  }

  // Sends `message` with this stream's session id.
  bool Send(v1::BackupClientMessage message) {
    if (message.session_id().empty()) message.set_session_id(session_);
    std::lock_guard<std::mutex> lock(write_mu_);
    return stream_->Write(message);
  }
  bool LayerStored(const std::vector<uint64_t>& ids, uint32_t step) {
    v1::BackupClientMessage message;
    auto* stored = message.mutable_layer_stored();
    stored->mutable_backup_ids()->Add(ids.begin(), ids.end());
    stored->set_step(step);
    return Send(message);
  }

  // Waits until `done(messages)` holds or the stream ended; returns whether
  // it holds.
  bool WaitFor(const std::function<
                   bool(const std::vector<v1::BackupServerMessage>&)>& done,
               absl::Duration timeout = absl::Seconds(20)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] {
      return done(messages_) || ended_;
    }) && done(messages_);
  }
  std::vector<v1::BackupServerMessage> Messages() {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }
  std::vector<v1::BackupServerMessage::Error> Errors() {
    std::vector<v1::BackupServerMessage::Error> errors;
    for (const auto& m : Messages()) {
      if (m.has_error()) errors.push_back(m.error());
    }
    return errors;
  }
  // The next error after the first `seen`.
  std::optional<v1::BackupServerMessage::Error> WaitError(size_t seen) {
    auto count = [](const std::vector<v1::BackupServerMessage>& messages) {
      size_t n = 0;
      for (const auto& m : messages) n += m.has_error();
      return n;
    };
    if (!WaitFor([&](const auto& m) { return count(m) > seen; })) {
      return std::nullopt;
    }
    return Errors()[seen];
  }
  static int64_t StepsDone(const std::vector<v1::BackupServerMessage>& messages,
                           uint64_t id) {
    int64_t n = 0;
    for (const auto& m : messages) {
      n += m.has_step_done() && m.step_done().backup_id() == id;
    }
    return n;
  }
  int64_t StepsDone(uint64_t id) { return StepsDone(Messages(), id); }
  // prepare(specs) -> the ids of `prepared`.
  std::vector<uint64_t> Prepare(const std::vector<v1::BackupSpec>& specs) {
    const size_t before = Count(&v1::BackupServerMessage::has_prepared);
    v1::BackupClientMessage message;
    for (const auto& spec : specs) {
      *message.mutable_prepare()->add_specs() = spec;
    }
    if (!Send(message)) return {};
    if (!WaitFor([&](const auto&) {
          return Count(&v1::BackupServerMessage::has_prepared, false) > before;
        })) {
      return {};
    }
    size_t seen = 0;
    for (const auto& m : Messages()) {
      if (m.has_prepared() && seen++ == before) {
        return {m.prepared().backup_ids().begin(),
                m.prepared().backup_ids().end()};
      }
    }
    return {};
  }
  size_t Count(bool (v1::BackupServerMessage::*has)() const, bool lock = true) {
    size_t n = 0;
    if (lock) {
      for (const auto& m : Messages()) n += (m.*has)();
    } else {  // Called from a WaitFor predicate: mu_ is held.
      for (const auto& m : messages_) n += (m.*has)();
    }
    return n;
  }
  bool ended() {
    std::lock_guard<std::mutex> lock(mu_);
    return ended_;
  }

  // Half-closes and waits for the server's end.
  grpc::Status Close() {
    {
      std::lock_guard<std::mutex> lock(write_mu_);
      stream_->WritesDone();
    }
    reader_.join();
    finished_ = true;
    return stream_->Finish();
  }

 private:
  const std::string session_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::BackupClientMessage,
                                           v1::BackupServerMessage>>
      stream_;
  std::thread reader_;
  std::mutex write_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::BackupServerMessage> messages_;
  bool ended_ = false;
  bool finished_ = false;
};

// A worker's Subscribe stream. Open() returns once `subscribed` arrived (or
// the daemon's refusal); with `background`, a thread reads every event.
class Subscription {
 public:
  static absl::StatusOr<std::unique_ptr<Subscription>> Open(
      v1::HiCache::Stub* stub, const std::string& session, bool background) {
    auto sub = std::unique_ptr<Subscription>(new Subscription());
    v1::SubscribeRequest request;
    request.set_session_id(session);
    sub->reader_ = stub->Subscribe(&sub->context_, request);
    v1::WorkerEvent first;
    if (!sub->reader_->Read(&first)) {
      const grpc::Status status = sub->reader_->Finish();
      sub->finished_ = true;
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          status.error_message());
    }
    if (!first.has_subscribed()) {
      return absl::InternalError("the first event is not `subscribed`");
    }
    if (background) {
      sub->thread_ = std::thread([s = sub.get()] {
        v1::WorkerEvent event;
        while (s->reader_->Read(&event)) {
          std::lock_guard<std::mutex> lock(s->mu_);
          s->events_.push_back(event);
          s->cv_.notify_all();
        }
        std::lock_guard<std::mutex> lock(s->mu_);
        s->ended_ = true;
        s->cv_.notify_all();
      });
    }
    return sub;
  }
  // Opens, retrying while the session's stream slots are taken (a slot of
  // a stream that just went away is freed once the daemon notices).
  static absl::StatusOr<std::unique_ptr<Subscription>> OpenWhenFree(
      v1::HiCache::Stub* stub, const std::string& session, bool background,
      absl::Duration timeout = absl::Seconds(15)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      auto sub = Open(stub, session, background);
      if (sub.ok() ||
          sub.status().code() != absl::StatusCode::kResourceExhausted ||
          absl::Now() > deadline) {
        return sub;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

  ~Subscription() {
    if (!finished_) {
      context_.TryCancel();
      if (thread_.joinable()) {
        thread_.join();
      } else {
        v1::WorkerEvent event;
        while (reader_->Read(&event)) {
        }
      }
      (void)reader_->Finish();
    }
  }

  // Reads one event in the foreground (no background thread).
  bool Read(v1::WorkerEvent* event) { return reader_->Read(event); }
  void Cancel() { context_.TryCancel(); }
  // Waits for the end of the stream and returns its status.
  grpc::Status Finish() {
    if (thread_.joinable()) {
      thread_.join();
    } else {
      v1::WorkerEvent event;
      while (reader_->Read(&event)) {
      }
    }
    finished_ = true;
    return reader_->Finish();
  }

  int64_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(events_.size());
  }
  bool ended() {
    std::lock_guard<std::mutex> lock(mu_);
    return ended_;
  }
  bool WaitFor(
      const std::function<bool(const std::vector<v1::WorkerEvent>&)>& done,
      absl::Duration timeout = absl::Seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] {
      return done(events_) || ended_;
    }) && done(events_);
  }
  bool WaitCount(int64_t n, absl::Duration timeout = absl::Seconds(10)) {
    return WaitFor(
        [n](const auto& events) {
          return static_cast<int64_t>(events.size()) >= n;
        },
        timeout);
  }

 private:
  Subscription() = default;

  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::WorkerEvent>> reader_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::WorkerEvent> events_;
  bool ended_ = false;
  bool finished_ = false;
};

class StreamAbuseTest : public ::testing::Test {
 protected:
  void StartDaemon(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {
        DaemonPath(),
        "--socket=" + socket_,
        absl::StrCat("--cp_size=", kCp),
        absl::StrCat("--page_size=", kPage),
        "--kv_preset=tiny",
        "--device_pages_per_rank=512",
        "--host_pages_per_rank=1024",
        absl::StrCat("--max_streams_per_session=", kMaxStreams),
        "--default_lease_ms=120000",
        // No write-through backups of their own between two snapshots.
        "--write_through_threshold=1000000",
        "--log_level=warn",
    };
    argv.insert(argv.end(), extra.begin(), extra.end());
    absl::StatusOr<Subprocess> daemon = Subprocess::Start(argv);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_.emplace(*std::move(daemon));
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline && daemon_->Running()) {
      // A fresh channel per try: one that failed to connect backs off.
      channel_ = OwnChannel(socket_);
      stub_ = v1::HiCache::NewStub(channel_);
      grpc::ClientContext ctx;
      Deadline(&ctx, absl::Seconds(1));
      v1::GetStatsResponse response;
      if (stub_->GetStats(&ctx, v1::GetStatsRequest(), &response).ok()) return;
      absl::SleepFor(absl::Milliseconds(20));
    }
    FAIL() << "hicached did not start; stderr:\n" << daemon_->Stderr();
  }

  void TearDown() override {
    if (daemon_.has_value()) {
      // The daemon must have survived every abuse.
      EXPECT_TRUE(daemon_->Running()) << daemon_->Stderr();
      stub_.reset();  // Our connection closes: nothing waits for the grace.
      channel_.reset();
      (void)daemon_->Signal(SIGTERM);
      absl::StatusOr<int> code = daemon_->Wait(absl::Seconds(30));
      EXPECT_TRUE(code.ok() && *code == 0)
          << (code.ok() ? absl::StrCat("exit ", *code)
                        : code.status().ToString())
          << "\n"
          << daemon_->Stderr();
    }
  }

  std::string Open(v1::Role role, uint32_t rank = 0,
                   const std::string& ns = kNs) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::OpenSessionRequest request;
    request.set_client_name(role == v1::ROLE_WORKER
                                ? absl::StrCat("worker", rank)
                                : std::string("scheduler"));
    request.set_role(role);
    request.set_rank(rank);
    request.set_namespace_(ns);
    v1::OpenSessionResponse response;
    grpc::Status status = stub_->OpenSession(&ctx, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.session_id();
  }

  v1::CacheStats Stats() {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::CacheStats stats;
    EXPECT_TRUE(stub_->Stats(&ctx, v1::GetStatsRequest(), &stats).ok());
    return stats;
  }

  Snapshot Snap() {
    const v1::CacheStats s = Stats();
    Snapshot out{s.nodes(),         s.device_tokens(),   s.protected_tokens(),
                 s.host_tokens(),   s.pending_backups(), s.backups_started(),
                 s.loads_started(), s.session_locks(),   s.session_pages(),
                 s.sessions(),      s.bytes_to_host(),   s.bytes_to_device()};
    for (const auto& lane : s.lanes()) out.allocated += lane.allocated();
    return out;
  }

  // Sessions as ListSessions (an operator RPC: the test runs as root)
  // reports them.
  int ListedSessions() {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::ListSessionsResponse response;
    grpc::Status status =
        stub_->ListSessions(&ctx, v1::ListSessionsRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.sessions_size();
  }

  std::vector<int64_t> Allocate(const std::string& session, int64_t n) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::AllocateRequest request;
    request.set_session_id(session);
    request.add_items()->set_num_pages(n);
    v1::AllocateResponse response;
    grpc::Status status = stub_->Allocate(&ctx, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    if (!status.ok()) return {};
    return {response.allocations(0).pages().begin(),
            response.allocations(0).pages().end()};
  }

  grpc::Status Admit(const v1::AdmitRequest& request,
                     v1::AdmitResponse* response) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    return stub_->Admit(&ctx, request, response);
  }
  v1::AdmitResult AdmitOne(const std::string& session,
                           const std::vector<int32_t>& tokens,
                           int64_t reserve = 0,
                           v1::BackupChoice backup = v1::BACKUP_CHOICE_NEVER) {
    v1::AdmitRequest request;
    request.set_session_id(session);
    v1::AdmitItem* item = request.add_items();
    item->set_tokens(Pack(tokens));
    item->set_reserve_tokens(reserve);
    item->set_backup(backup);
    v1::AdmitResponse response;
    grpc::Status status = Admit(request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.results_size(), 1);
    return response.results_size() == 1 ? response.results(0)
                                        : v1::AdmitResult();
  }
  grpc::Status Complete(const v1::CompleteRequest& request,
                        v1::CompleteResponse* response) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    return stub_->Complete(&ctx, request, response);
  }
  // The Complete item that caches `tokens` (the admitted input), releases
  // the admission's lock and frees the rest of its pages.
  static v1::CompleteItem CompleteItemFor(const v1::AdmitResult& a,
                                          const std::vector<int32_t>& tokens) {
    v1::CompleteItem item;
    item.set_tokens(Pack(tokens));
    item.set_backup_id(a.backup_id());
    if (a.lock_handle() != 0) item.add_lock_handles(a.lock_handle());
    item.set_free_uncached(true);
    const size_t cached = (tokens.size() + kPage - 1) / kPage;
    std::vector<int64_t> all(a.device().pages().begin(),
                             a.device().pages().end());
    all.insert(all.end(), a.pages().begin(), a.pages().end());
    for (size_t i = 0; i < all.size(); ++i) {
      if (i < cached) {
        item.add_pages(all[i]);
      } else {
        item.add_free_pages(all[i]);
      }
    }
    return item;
  }
  grpc::Status CompleteOne(const std::string& session,
                           const v1::CompleteItem& item,
                           v1::CompleteResponse* response = nullptr) {
    v1::CompleteRequest request;
    request.set_session_id(session);
    *request.add_items() = item;
    v1::CompleteResponse unused;
    return Complete(request, response != nullptr ? response : &unused);
  }
  // Caches `tokens` on device (no backup) for `session`; returns its node.
  uint64_t Cache(const std::string& session,
                 const std::vector<int32_t>& tokens) {
    const v1::AdmitResult a = AdmitOne(session, tokens);
    v1::CompleteResponse response;
    grpc::Status status =
        CompleteOne(session, CompleteItemFor(a, tokens), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.results_size() == 1 ? response.results(0).node() : 0;
  }

  grpc::Status Unlock(const std::string& session,
                      const std::vector<uint64_t>& handles) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::LockRequest request;
    request.set_session_id(session);
    request.mutable_lock_handles()->Add(handles.begin(), handles.end());
    v1::LockResponse response;
    return stub_->Unlock(&ctx, request, &response);
  }

  // A LoadBack stream read to its end.
  struct LoadBackRun {
    std::vector<v1::LoadBackEvent> events;
    grpc::Status status;
  };
  LoadBackRun LoadBack(const v1::LoadBackRequest& request) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    LoadBackRun run;
    auto reader = stub_->LoadBack(&ctx, request);
    v1::LoadBackEvent event;
    while (reader->Read(&event)) run.events.push_back(event);
    run.status = reader->Finish();
    return run;
  }

  // Caches `tokens` with a committed host copy, then evicts its device copy
  // (the operator's Evict): a host-only hit.
  void CacheOnHostOnly(const std::string& scheduler,
                       const std::vector<int32_t>& tokens) {
    const int64_t committed = Stats().backups_committed();
    const v1::AdmitResult a =
        AdmitOne(scheduler, tokens, 0, v1::BACKUP_CHOICE_ALWAYS);
    ASSERT_NE(a.backup_id(), 0u);
    {
      BackupStream stream(stub_.get(), scheduler);
      for (uint32_t step = 0; step < kSteps; ++step) {
        ASSERT_TRUE(stream.LayerStored({a.backup_id()}, step));
      }
      ASSERT_TRUE(stream.Close().ok());
      EXPECT_TRUE(stream.Errors().empty());
    }
    v1::CompleteResponse response;
    ASSERT_TRUE(
        CompleteOne(scheduler, CompleteItemFor(a, tokens), &response).ok());
    ASSERT_TRUE(response.results(0).backup_attached());
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (Stats().backups_committed() == committed && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_GT(Stats().backups_committed(), committed);
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::EvictRequest evict;
    for (uint32_t lane = 0; lane < kCp; ++lane) {
      evict.add_device_pages_per_lane(1 << 20);
    }
    v1::EvictResponse evicted;
    ASSERT_TRUE(stub_->Evict(&ctx, evict, &evicted).ok());
    ASSERT_GT(evicted.device_pages_freed(), 0);
  }

  // Events for the workers of kNs: `pages.size()` one-page backups prepared
  // on the scheduler's `stream`, every step stored, every step_done awaited,
  // then each rolled back. Each worker hears pages.size() * kSteps
  // backup_step and pages.size() backup_ended events.
  void Churn(BackupStream& stream, const std::vector<int64_t>& pages) {
    std::vector<v1::BackupSpec> specs;
    for (int64_t page : pages) {
      v1::BackupSpec spec;
      spec.add_pages(page);
      spec.set_logical_tokens(kPage);
      specs.push_back(spec);
    }
    const std::vector<uint64_t> ids = stream.Prepare(specs);
    ASSERT_EQ(ids.size(), pages.size());
    for (uint64_t id : ids) ASSERT_NE(id, 0u);
    for (uint32_t step = 0; step < kSteps; ++step) {
      ASSERT_TRUE(stream.LayerStored(ids, step));
    }
    const std::set<uint64_t> mine(ids.begin(), ids.end());
    ASSERT_TRUE(stream.WaitFor([&](const auto& messages) {
      int64_t n = 0;
      for (const auto& m : messages) {
        n += m.has_step_done() && mine.contains(m.step_done().backup_id());
      }
      return n == static_cast<int64_t>(ids.size() * kCp * kSteps);
    })) << "not every step_done arrived";
    for (uint64_t id : ids) {
      v1::BackupClientMessage rollback;
      rollback.mutable_rollback()->set_backup_id(id);
      ASSERT_TRUE(stream.Send(rollback));
    }
    ASSERT_TRUE(stream.WaitFor([&](const auto& messages) {
      int64_t n = 0;
      for (const auto& m : messages) {
        n += m.has_rolled_back() && mine.contains(m.rolled_back().backup_id());
      }
      return n == static_cast<int64_t>(ids.size());
    })) << "not every rolled_back arrived";
  }

  // Asserts that `session` can hold kMaxStreams Subscribe streams at once
  // (no slot leaked by an earlier stream) and not one more.
  void ExpectEveryStreamSlotFree(const std::string& session) {
    std::vector<std::unique_ptr<Subscription>> held;
    for (int i = 0; i < kMaxStreams; ++i) {
      auto sub = Subscription::OpenWhenFree(stub_.get(), session,
                                            /*background=*/true);
      ASSERT_TRUE(sub.ok()) << "stream slot " << i
                            << " of the session is still taken (a stream "
                               "that went away was never released): "
                            << sub.status();
      held.push_back(*std::move(sub));
    }
    auto one_more = Subscription::Open(stub_.get(), session, true);
    ASSERT_FALSE(one_more.ok()) << "the stream limit does not apply";
    EXPECT_EQ(one_more.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(one_more.status().message(),
                HasSubstr("max_streams_per_session"));
  }

  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("hicached.sock");
  std::optional<Subprocess> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::HiCache::Stub> stub_;
};

// --- Worker Subscribe streams that go away ---------------------------------

TEST_F(StreamAbuseTest, CancelledSubscribeUnsubscribesAndFreesItsSlot) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::string w0 = Open(v1::ROLE_WORKER, 0);
  const std::string w1 = Open(v1::ROLE_WORKER, 1);
  // Worker 1 listens throughout.
  auto steady = Subscription::Open(stub_.get(), w1, /*background=*/true);
  ASSERT_TRUE(steady.ok()) << steady.status();
  const std::vector<int64_t> pages = Allocate(scheduler, 16);
  ASSERT_EQ(pages.size(), 16u);
  BackupStream stream(stub_.get(), scheduler);
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0};
  std::thread churn([&] {
    while (!stop.load()) {
      Churn(stream, pages);
      if (::testing::Test::HasFatalFailure()) return;
      rounds.fetch_add(1);
    }
  });
  struct Joiner {  // Also when an assertion below returns early.
    std::atomic<bool>& stop;
    std::thread& thread;
    ~Joiner() {
      stop = true;
      if (thread.joinable()) thread.join();
    }
  } joiner{stop, churn};
  // Worker 0 subscribes and cancels, more times than it has stream slots,
  // each time in the middle of a flow of events.
  for (int i = 0; i < 3 * kMaxStreams; ++i) {
    auto sub = Subscription::OpenWhenFree(stub_.get(), w0, false);
    ASSERT_TRUE(sub.ok()) << "subscription " << i << ": " << sub.status();
    v1::WorkerEvent event;
    for (int n = 0; n < 5; ++n) {
      ASSERT_TRUE((*sub)->Read(&event)) << "subscription " << i;
      EXPECT_EQ(event.rank(), 0u);
    }
    (*sub)->Cancel();
    const grpc::Status status = (*sub)->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED)
        << status.error_message();
  }
  // The daemon kept serving the other worker while worker 0 came and went.
  const int64_t heard = (*steady)->count();
  EXPECT_GT(heard, 0);
  EXPECT_TRUE((*steady)->WaitCount(heard + 10))
      << "worker 1 stopped hearing events";
  stop = true;
  churn.join();
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_GT(rounds.load(), 0);
  EXPECT_FALSE((*steady)->ended());
  // No slot of worker 0 leaked, and nothing else either.
  ASSERT_NO_FATAL_FAILURE(ExpectEveryStreamSlotFree(w0));
  EXPECT_TRUE(stream.Close().ok());
  EXPECT_TRUE(stream.Errors().empty());
  const v1::CacheStats stats = Stats();
  EXPECT_EQ(stats.sessions(), 3);
  EXPECT_EQ(ListedSessions(), 3);
  EXPECT_EQ(stats.session_locks(), 0);
  EXPECT_EQ(stats.pending_backups(), 0);
  EXPECT_EQ(stats.session_pages(), 16);  // The churn's own pages.
}

// The helper process of the next test: subscribes, says so on stdout, then
// never reads again until it is killed. Skipped unless run by that test.
TEST(StreamAbuseHelper, DISABLED_SubscribeThenHang) {
  const char* socket = getenv(kHelperSocketEnv);
  const char* session = getenv(kHelperSessionEnv);
  if (socket == nullptr || session == nullptr) GTEST_SKIP();
  auto stub = v1::HiCache::NewStub(OwnChannel(socket));
  auto sub = Subscription::Open(stub.get(), session, /*background=*/false);
  if (!sub.ok()) {
    std::printf("failed: %s\n", sub.status().ToString().c_str());
    std::fflush(stdout);
    _exit(1);
  }
  std::printf("live\n");
  std::fflush(stdout);
  absl::SleepFor(absl::Seconds(120));
  _exit(0);
}

TEST_F(StreamAbuseTest, KilledSubscriberProcessFreesItsSlot) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::string w0 = Open(v1::ROLE_WORKER, 0);
  const std::string w1 = Open(v1::ROLE_WORKER, 1);
  auto steady = Subscription::Open(stub_.get(), w1, /*background=*/true);
  ASSERT_TRUE(steady.ok()) << steady.status();
  // Worker 0's subscription lives in another process (this binary), which
  // then stops reading and is killed: its connection drops, nobody cancels.
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  absl::StatusOr<Subprocess> child = Subprocess::Start({
      "/usr/bin/env",
      "-u",
      "TEST_PREMATURE_EXIT_FILE",
      "-u",
      "XML_OUTPUT_FILE",
      absl::StrCat(kHelperSocketEnv, "=", socket_),
      absl::StrCat(kHelperSessionEnv, "=", w0),
      self,
      "--gtest_filter=StreamAbuseHelper.DISABLED_SubscribeThenHang",
      "--gtest_also_run_disabled_tests",
  });
  ASSERT_TRUE(child.ok()) << child.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (child->Stdout().find("live") == std::string::npos &&
         child->Running() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_THAT(child->Stdout(), HasSubstr("live")) << child->Stderr();
  // Events flow to both workers, then the first one dies.
  const std::vector<int64_t> pages = Allocate(scheduler, 16);
  BackupStream stream(stub_.get(), scheduler);
  ASSERT_NO_FATAL_FAILURE(Churn(stream, pages));
  ASSERT_TRUE(child->Signal(SIGKILL).ok());
  ASSERT_TRUE(child->Wait(absl::Seconds(10)).ok());
  ASSERT_NO_FATAL_FAILURE(Churn(stream, pages));
  // Worker 1 heard every event of both rounds: 2 x 16 x (2 steps + end).
  EXPECT_TRUE((*steady)->WaitCount(2 * 16 * (kSteps + 1)))
      << (*steady)->count();
  ASSERT_NO_FATAL_FAILURE(ExpectEveryStreamSlotFree(w0));
  EXPECT_TRUE(stream.Close().ok());
  EXPECT_EQ(Stats().sessions(), 3);
  EXPECT_EQ(ListedSessions(), 3);
}

TEST_F(StreamAbuseTest, SubscriberThatStopsReadingIsCutOffAlone) {
  // A small backlog: a stream whose client stops reading is cut off once
  // 256 events wait for it.
  ASSERT_NO_FATAL_FAILURE(StartDaemon({"--max_stream_backlog=256"}));
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::string w0 = Open(v1::ROLE_WORKER, 0);
  const std::string w1 = Open(v1::ROLE_WORKER, 1);
  auto steady = Subscription::Open(stub_.get(), w1, /*background=*/true);
  ASSERT_TRUE(steady.ok()) << steady.status();
  // Worker 0 reads `subscribed`, then nothing: on a connection of its own
  // with a small flow-control window, so the daemon's writes block soon.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
  auto stuck_stub = v1::HiCache::NewStub(OwnChannel(socket_, args));
  auto stuck = Subscription::Open(stuck_stub.get(), w0, /*background=*/false);
  ASSERT_TRUE(stuck.ok()) << stuck.status();
  ASSERT_EQ(kMaxStreams, 2);
  auto second = Subscription::Open(stub_.get(), w0, /*background=*/true);
  ASSERT_TRUE(second.ok()) << second.status();  // Worker 0's other slot.
  // Worker 0 now holds both of its slots: once the stuck stream is cut
  // off, one is free again.
  const std::vector<int64_t> pages = Allocate(scheduler, 32);
  BackupStream stream(stub_.get(), scheduler);
  bool cut = false;
  int rounds = 0;
  for (; rounds < 200 && !cut; ++rounds) {
    ASSERT_NO_FATAL_FAILURE(Churn(stream, pages));
    auto probe = Subscription::Open(stub_.get(), w0, /*background=*/true);
    cut = probe.ok();
  }
  ASSERT_TRUE(cut) << "a worker stream nobody read was never cut off after "
                   << rounds << " rounds of " << 32 * (kSteps + 1) << " events";
  // The stuck stream ends (its buffered events, then the daemon's cancel)
  // without the client cancelling anything.
  const grpc::Status status = (*stuck)->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED)
      << status.error_message();
  // The readers that kept up were never cut off and heard everything.
  const int64_t expected = rounds * 32 * (kSteps + 1);
  EXPECT_TRUE((*steady)->WaitCount(expected)) << (*steady)->count();
  EXPECT_TRUE((*second)->WaitCount(expected)) << (*second)->count();
  EXPECT_FALSE((*steady)->ended());
  EXPECT_FALSE((*second)->ended());
  EXPECT_TRUE(stream.Close().ok());
  EXPECT_TRUE(stream.Errors().empty());
}

TEST_F(StreamAbuseTest, SubscribeNeedsAWorkerSession) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  auto refused = Subscription::Open(stub_.get(), scheduler, false);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("worker session"));
  auto unknown = Subscription::Open(stub_.get(), "s1-nosuchsession", false);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  // Refusals hold no stream slot.
  const std::string w0 = Open(v1::ROLE_WORKER, 0);
  ASSERT_NO_FATAL_FAILURE(ExpectEveryStreamSlotFree(w0));
}

// --- layer_stored with absurd lists ------------------------------------------

TEST_F(StreamAbuseTest, LayerStoredWithHugeFenceListIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::string w0 = Open(v1::ROLE_WORKER, 0);
  const std::vector<int64_t> pages = Allocate(scheduler, 2);
  BackupStream stream(stub_.get(), scheduler);
  v1::BackupSpec spec;
  spec.mutable_pages()->Add(pages.begin(), pages.end());
  spec.set_logical_tokens(2 * kPage);
  const std::vector<uint64_t> ids = stream.Prepare({spec});
  ASSERT_EQ(ids.size(), 1u);
  const uint64_t backup = ids[0];
  ASSERT_NE(backup, 0u);
  const Snapshot before = Snap();
  // 100000 fences: every rank many times over, ids nobody registered.
  v1::BackupClientMessage huge;
  huge.mutable_layer_stored()->add_backup_ids(backup);
  huge.mutable_layer_stored()->set_step(0);
  for (int i = 0; i < 100000; ++i) {
    v1::RankFence* fence = huge.mutable_layer_stored()->add_fences();
    fence->set_rank(i % 3);  // Rank 2 is no rank at C = 2.
    fence->set_fence_id(1000 + i % 7);
  }
  ASSERT_TRUE(stream.Send(huge));
  std::optional<v1::BackupServerMessage::Error> error = stream.WaitError(0);
  ASSERT_TRUE(error.has_value()) << "no error for 100000 fences";
  EXPECT_EQ(error->code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT))
      << error->message();
  EXPECT_THAT(error->message(), HasSubstr("100000 fences"));
  EXPECT_THAT(error->message(), HasSubstr(absl::StrCat(kCp, " ranks")));
  // As many fences as ranks, but repeated ranks and unknown ids.
  v1::BackupClientMessage repeated;
  repeated.mutable_layer_stored()->add_backup_ids(backup);
  for (uint32_t i = 0; i < kCp; ++i) {
    v1::RankFence* fence = repeated.mutable_layer_stored()->add_fences();
    fence->set_rank(0);
    fence->set_fence_id(77);
  }
  ASSERT_TRUE(stream.Send(repeated));
  error = stream.WaitError(1);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), static_cast<int>(grpc::StatusCode::NOT_FOUND))
      << error->message();
  EXPECT_THAT(error->message(), HasSubstr("fences[0] = 77"));
  // The same from the worker of rank 0, on its own stream.
  BackupStream worker(stub_.get(), w0);
  ASSERT_TRUE(worker.Send(huge));
  error = worker.WaitError(0);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT))
      << error->message();
  EXPECT_THAT(error->message(), HasSubstr("100000 fences"));
  // Nothing was submitted: no step_done, no byte copied.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(stream.StepsDone(backup), 0);
  EXPECT_EQ(Snap(), before);
  // Both streams still work: the backup stores and commits normally.
  EXPECT_FALSE(stream.ended());
  EXPECT_FALSE(worker.ended());
  for (uint32_t step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(stream.LayerStored({backup}, step));
  }
  EXPECT_TRUE(stream.WaitFor([&](const auto& messages) {
    return BackupStream::StepsDone(messages, backup) == kCp * kSteps;
  }));
  EXPECT_EQ(stream.Errors().size(), 2u);
  EXPECT_EQ(worker.Errors().size(), 1u);
  EXPECT_TRUE(worker.Close().ok());
  EXPECT_TRUE(stream.Close().ok());  // Unattached: rolled back at the close.
  EXPECT_EQ(Stats().pending_backups(), 0);
}

TEST_F(StreamAbuseTest, LayerStoredWithHugeBackupIdListIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::string w1 = Open(v1::ROLE_WORKER, 1);
  const std::vector<int64_t> pages = Allocate(scheduler, 1);
  BackupStream stream(stub_.get(), scheduler);
  v1::BackupSpec spec;
  spec.add_pages(pages[0]);
  spec.set_logical_tokens(kPage);
  const std::vector<uint64_t> ids = stream.Prepare({spec});
  ASSERT_EQ(ids.size(), 1u);
  const uint64_t backup = ids[0];
  const Snapshot before = Snap();
  // 100000 ids: the real backup among repeats and ids that do not exist.
  std::vector<uint64_t> many;
  for (int i = 0; i < 100000; ++i) {
    many.push_back(i % 2 == 0 ? backup : 1000000 + i);
  }
  ASSERT_TRUE(stream.LayerStored(many, 0));
  std::optional<v1::BackupServerMessage::Error> error = stream.WaitError(0);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT))
      << error->message();
  EXPECT_THAT(error->message(), HasSubstr("100000 entries"));
  EXPECT_THAT(error->message(), HasSubstr(absl::StrCat(kItemLimit)));
  // Just past the limit, from a worker.
  BackupStream worker(stub_.get(), w1);
  ASSERT_TRUE(
      worker.LayerStored(std::vector<uint64_t>(kItemLimit + 1, backup), 0));
  error = worker.WaitError(0);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT))
      << error->message();
  EXPECT_THAT(error->message(), HasSubstr(absl::StrCat(kItemLimit)));
  // Within the limit, one unknown id refuses the whole message.
  ASSERT_TRUE(stream.LayerStored({backup, 999999999}, 0));
  error = stream.WaitError(1);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT))
      << error->message();
  EXPECT_THAT(error->message(), HasSubstr("999999999"));
  // A step past the last.
  ASSERT_TRUE(stream.LayerStored({backup}, UINT32_MAX));
  error = stream.WaitError(2);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT))
      << error->message();
  EXPECT_THAT(error->message(), HasSubstr("step"));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(stream.StepsDone(backup), 0) << "a refused layer_stored copied";
  EXPECT_EQ(Snap(), before);
  // Its own id repeated (within the limit) is refused too, naming it.
  ASSERT_TRUE(stream.LayerStored({backup, backup, backup}, 0));
  error = stream.WaitError(3);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT))
      << error->message();
  EXPECT_THAT(error->message(), HasSubstr("named twice"));
  // The backup is intact: stored once per step.
  for (uint32_t step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(stream.LayerStored({backup}, step));
  }
  EXPECT_TRUE(stream.WaitFor([&](const auto& messages) {
    return BackupStream::StepsDone(messages, backup) == kCp * kSteps;
  }));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(stream.StepsDone(backup), kCp * kSteps);
  EXPECT_TRUE(worker.Close().ok());
  EXPECT_TRUE(stream.Close().ok());
}

// A worker's BackupSession only acks; closing it (half-close or cancel) in
// the middle of a backup rolls back nothing of the scheduler's.
TEST_F(StreamAbuseTest, WorkerBackupStreamGoingAwayRollsBackNothing) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::string w0 = Open(v1::ROLE_WORKER, 0);
  const std::string w1 = Open(v1::ROLE_WORKER, 1);
  const std::vector<int64_t> pages = Allocate(scheduler, 2);
  BackupStream stream(stub_.get(), scheduler);
  v1::BackupSpec spec;
  spec.mutable_pages()->Add(pages.begin(), pages.end());
  spec.set_logical_tokens(2 * kPage);
  const std::vector<uint64_t> ids = stream.Prepare({spec});
  ASSERT_EQ(ids.size(), 1u);
  const uint64_t backup = ids[0];
  {
    BackupStream half(stub_.get(), w0);  // Acks step 0, then half-closes.
    ASSERT_TRUE(half.LayerStored({backup}, 0));
    EXPECT_TRUE(half.Close().ok());
    EXPECT_TRUE(half.Errors().empty());
  }
  {
    BackupStream dropped(stub_.get(), w1);  // Acks step 0, then cancels.
    ASSERT_TRUE(dropped.LayerStored({backup}, 0));
    ASSERT_TRUE(stream.WaitFor([&](const auto& messages) {
      return BackupStream::StepsDone(messages, backup) == kCp;
    }));
  }  // ~BackupStream cancels.
  // The scheduler stores the last step for every rank; the backup is whole.
  ASSERT_TRUE(stream.LayerStored({backup}, kSteps - 1));
  EXPECT_TRUE(stream.WaitFor([&](const auto& messages) {
    return BackupStream::StepsDone(messages, backup) == kCp * kSteps;
  }));
  EXPECT_EQ(stream.Count(&v1::BackupServerMessage::has_rolled_back), 0u);
  EXPECT_EQ(Stats().backups_rolled_back(), 0);
  EXPECT_TRUE(stream.Errors().empty());
  EXPECT_TRUE(stream.Close().ok());  // Unattached: rolled back now.
  EXPECT_EQ(Stats().backups_rolled_back(), 1);
  ASSERT_NO_FATAL_FAILURE(ExpectEveryStreamSlotFree(w0));
  ASSERT_NO_FATAL_FAILURE(ExpectEveryStreamSlotFree(w1));
}

TEST_F(StreamAbuseTest, BackupStreamWithAnotherSessionIdEndsAndRollsBack) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::string other = Open(v1::ROLE_SCHEDULER);
  const std::vector<int64_t> pages = Allocate(scheduler, 1);
  BackupStream stream(stub_.get(), scheduler);
  v1::BackupSpec spec;
  spec.add_pages(pages[0]);
  spec.set_logical_tokens(kPage);
  ASSERT_EQ(stream.Prepare({spec}).size(), 1u);
  ASSERT_EQ(Stats().pending_backups(), 0);  // Not attached: not in the tree.
  v1::BackupClientMessage hijack;
  hijack.set_session_id(other);
  hijack.mutable_rollback()->set_backup_id(1);
  ASSERT_TRUE(stream.Send(hijack));
  const grpc::Status status = stream.Close();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("session_id"));
  // The stream's backup was rolled back; the pages stay the session's.
  const v1::CacheStats stats = Stats();
  EXPECT_EQ(stats.backups_rolled_back(), 1);
  EXPECT_EQ(stats.session_pages(), 1);
  // A first message without a session id: refused, no slot taken.
  BackupStream anonymous(stub_.get(), "");
  v1::BackupClientMessage nameless;
  nameless.mutable_store_all()->set_backup_id(1);
  {
    // Send() fills in the stream's session id; this one has none.
    ASSERT_TRUE(anonymous.Send(nameless));
  }
  EXPECT_EQ(anonymous.Close().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// --- LoadBack, Admit, Complete with absurd or foreign arguments --------------

TEST_F(StreamAbuseTest, LoadBackWithHugeItemsOrExtendIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::vector<int32_t> tokens = Seq(0, 3 * kPage);
  ASSERT_NO_FATAL_FAILURE(CacheOnHostOnly(scheduler, tokens));
  const Snapshot before = Snap();
  // Items past the limit.
  v1::LoadBackRequest many;
  many.set_session_id(scheduler);
  for (int i = 0; i <= kItemLimit; ++i)
    many.add_items()->set_tokens(Pack(tokens));
  LoadBackRun run = LoadBack(many);
  EXPECT_EQ(run.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(run.status.error_message(), HasSubstr(absl::StrCat(kItemLimit)));
  EXPECT_TRUE(run.events.empty());
  // An extend no request has, alone or in a batch, and a negative one.
  for (int64_t extend : {INT64_MAX, kTokenLimit + 1, int64_t{-1}, INT64_MIN}) {
    v1::LoadBackRequest one;
    one.set_session_id(scheduler);
    one.set_tokens(Pack(tokens));
    one.set_extend_tokens(extend);
    run = LoadBack(one);
    EXPECT_EQ(run.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << extend;
    EXPECT_THAT(run.status.error_message(),
                HasSubstr(absl::StrCat("extend_tokens must be in [0, ",
                                       kTokenLimit, "]")));
    EXPECT_TRUE(run.events.empty());
    v1::LoadBackRequest batch;
    batch.set_session_id(scheduler);
    batch.add_items()->set_tokens(Pack(tokens));
    v1::LoadItem* bad = batch.add_items();
    bad->set_tokens(Pack(tokens));
    bad->set_extend_tokens(extend);
    run = LoadBack(batch);
    EXPECT_EQ(run.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(run.events.empty()) << "a refused batch started item 0";
  }
  EXPECT_EQ(Snap(), before);
  // The largest extend allowed, more than the pool: an over_quota miss that
  // leaves the host copy alone and locks only the (empty) device hit.
  v1::LoadBackRequest greedy;
  greedy.set_session_id(scheduler);
  greedy.set_tokens(Pack(tokens));
  greedy.set_extend_tokens(kTokenLimit);
  run = LoadBack(greedy);
  ASSERT_TRUE(run.status.ok()) << run.status.error_message();
  ASSERT_EQ(run.events.size(), 2u);
  ASSERT_TRUE(run.events[0].has_started());
  EXPECT_EQ(run.events[0].started().load_id(), 0u);
  EXPECT_EQ(run.events[0].started().miss_reason(), "over_quota");
  ASSERT_TRUE(run.events[1].has_done());
  EXPECT_TRUE(run.events[1].done().ok());
  EXPECT_EQ(run.events[1].done().load_id(), 0u);
  Snapshot after = Snap();
  EXPECT_EQ(after.loads_started, before.loads_started);
  EXPECT_EQ(after.host_tokens, before.host_tokens);
  EXPECT_EQ(after.allocated, before.allocated);
  if (run.events[0].started().lock_handle() != 0) {
    ASSERT_TRUE(
        Unlock(scheduler, {run.events[0].started().lock_handle()}).ok());
  }
  EXPECT_EQ(Snap(), before);
  // The copy is still loadable with a sane extend.
  v1::LoadBackRequest sane;
  sane.set_session_id(scheduler);
  sane.set_tokens(Pack(tokens));
  sane.set_extend_tokens(kPage);
  run = LoadBack(sane);
  ASSERT_TRUE(run.status.ok()) << run.status.error_message();
  ASSERT_FALSE(run.events.empty());
  ASSERT_TRUE(run.events.back().has_done());
  EXPECT_TRUE(run.events.back().done().ok());
  EXPECT_NE(run.events.front().started().load_id(), 0u);
  ASSERT_TRUE(Unlock(scheduler, {run.events.back().done().lock_handle()}).ok());
  EXPECT_EQ(Stats().session_locks(), 0);
}

TEST_F(StreamAbuseTest, AdmitWithHugeReserveIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::vector<int32_t> prefix = Seq(0, 2 * kPage);
  Cache(scheduler, prefix);  // A device hit the refused calls must not lock.
  const std::vector<int32_t> tokens = Seq(0, 3 * kPage);
  const Snapshot before = Snap();
  ASSERT_EQ(before.session_locks, 0);
  auto request = [&](std::vector<int64_t> reserves) {
    v1::AdmitRequest r;
    r.set_session_id(scheduler);
    for (int64_t reserve : reserves) {
      v1::AdmitItem* item = r.add_items();
      item->set_tokens(Pack(tokens));
      item->set_reserve_tokens(reserve);
      item->set_backup(v1::BACKUP_CHOICE_ALWAYS);
    }
    return r;
  };
  v1::AdmitResponse response;
  for (int64_t reserve : {INT64_MAX, kTokenLimit + 1, int64_t{-1}, INT64_MIN}) {
    grpc::Status status = Admit(request({0, reserve}), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << reserve;
    EXPECT_THAT(
        status.error_message(),
        HasSubstr(absl::StrCat("items[1].reserve_tokens must be in [0, ",
                               kTokenLimit, "]")));
  }
  // Allowed, but more than the whole pool: the call fails before any item
  // is matched (the first one would fit).
  grpc::Status status = Admit(request({0, kTokenLimit}), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("items[1]"));
  EXPECT_THAT(status.error_message(), HasSubstr("usable device pages"));
  // Items past the limit.
  status = Admit(request(std::vector<int64_t>(kItemLimit + 1, 0)), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat(kItemLimit)));
  EXPECT_EQ(Snap(), before);
  // A sane request still goes through and returns everything.
  const v1::AdmitResult a = AdmitOne(scheduler, tokens, kPage);
  ASSERT_TRUE(a.admitted());
  EXPECT_EQ(a.device().valid_tokens(), 2 * kPage);
  ASSERT_TRUE(CompleteOne(scheduler, CompleteItemFor(a, tokens)).ok());
  EXPECT_EQ(Stats().session_locks(), 0);
  EXPECT_EQ(Stats().session_pages(), 0);
}

TEST_F(StreamAbuseTest,
       CompleteWithAnotherSessionsHandleOrPagesChangesNothing) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string a_id = Open(v1::ROLE_SCHEDULER);
  const std::string b_id = Open(v1::ROLE_SCHEDULER);
  Cache(a_id, Seq(0, 2 * kPage));
  const std::vector<int32_t> a_tokens = Seq(0, 4 * kPage);
  const std::vector<int32_t> b_tokens = Seq(100, 3 * kPage);
  const v1::AdmitResult a = AdmitOne(a_id, a_tokens, kPage);
  const v1::AdmitResult b = AdmitOne(b_id, b_tokens, kPage);
  ASSERT_NE(a.lock_handle(), 0u);
  ASSERT_EQ(a.pages_size(), 3);
  ASSERT_EQ(b.pages_size(), 4);
  const Snapshot before = Snap();
  ASSERT_EQ(before.session_locks, 1);
  const v1::CompleteItem b_good = CompleteItemFor(b, b_tokens);
  // B releases A's lock handle: NOT_FOUND, nothing changed.
  v1::CompleteItem steal = b_good;
  steal.add_lock_handles(a.lock_handle());
  grpc::Status status = CompleteOne(b_id, steal);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("not a lock of this session"));
  EXPECT_EQ(Snap(), before);
  // B caches A's tokens in A's pages.
  status = CompleteOne(b_id, CompleteItemFor(a, a_tokens));
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(Snap(), before);
  v1::CompleteItem a_pages_only = CompleteItemFor(a, a_tokens);
  a_pages_only.clear_lock_handles();
  status = CompleteOne(b_id, a_pages_only);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("not held by this session"));
  EXPECT_EQ(Snap(), before);
  // B frees A's pages along with its own Complete.
  v1::CompleteItem free_theirs = b_good;
  free_theirs.add_free_pages(a.pages(2));
  status = CompleteOne(b_id, free_theirs);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("free_pages"));
  EXPECT_EQ(Snap(), before);
  // B attaches a backup it does not own.
  v1::CompleteItem foreign_backup = b_good;
  foreign_backup.set_backup_id(123456);
  status = CompleteOne(b_id, foreign_backup);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << status.error_message();
  EXPECT_EQ(Snap(), before);
  // A worker completes: PERMISSION_DENIED, before anything else.
  const std::string w0 = Open(v1::ROLE_WORKER, 0);
  status = CompleteOne(w0, CompleteItemFor(a, a_tokens));
  EXPECT_FALSE(status.ok());
  Snapshot with_worker = before;
  with_worker.sessions += 1;
  EXPECT_EQ(Snap(), with_worker);
  // Both still complete their own requests, and everything is returned.
  ASSERT_TRUE(CompleteOne(a_id, CompleteItemFor(a, a_tokens)).ok());
  ASSERT_TRUE(CompleteOne(b_id, b_good).ok());
  EXPECT_EQ(Stats().session_locks(), 0);
  EXPECT_EQ(Stats().session_pages(), 0);
}

TEST_F(StreamAbuseTest, RepeatedHandleOrPageIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  Cache(scheduler, Seq(0, 2 * kPage));
  const std::vector<int32_t> tokens = Seq(0, 3 * kPage);
  const v1::AdmitResult a = AdmitOne(scheduler, tokens, 2 * kPage);
  const uint64_t h = a.lock_handle();
  ASSERT_NE(h, 0u);
  const v1::CompleteItem good = CompleteItemFor(a, tokens);
  ASSERT_EQ(good.free_pages_size(), 2);
  const Snapshot before = Snap();
  // One handle twice in one item.
  v1::CompleteItem twice = good;
  twice.add_lock_handles(h);
  grpc::Status status = CompleteOne(scheduler, twice);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("repeated"));
  EXPECT_EQ(Snap(), before);
  // One handle in two items of one call.
  v1::CompleteRequest two;
  two.set_session_id(scheduler);
  *two.add_items() = good;
  v1::CompleteItem other = good;
  other.clear_pages();
  other.clear_free_pages();
  other.set_backup_id(0);
  other.set_free_uncached(false);
  other.set_tokens(Pack(Seq(500, kPage)));
  other.add_pages(a.pages(1));
  *two.add_items() = other;
  v1::CompleteResponse response;
  status = Complete(two, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("repeated"));
  EXPECT_EQ(Snap(), before);
  // One page to free twice.
  v1::CompleteItem free_twice = good;
  free_twice.add_free_pages(good.free_pages(0));
  status = CompleteOne(scheduler, free_twice);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Snap(), before);
  // A page both cached and freed.
  v1::CompleteItem both = good;
  both.add_free_pages(good.pages(good.pages_size() - 1));
  status = CompleteOne(scheduler, both);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Snap(), before);
  // Unlock with the handle twice.
  status = Unlock(scheduler, {h, h});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("repeated"));
  EXPECT_EQ(Snap(), before);
  // The real Complete, then the same handle again: released already.
  ASSERT_TRUE(CompleteOne(scheduler, good).ok());
  EXPECT_EQ(Stats().session_locks(), 0);
  EXPECT_EQ(Stats().session_pages(), 0);
  const Snapshot done = Snap();
  status = Unlock(scheduler, {h});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Snap(), done);
}

// --- Bugs found here, now fixed ---------------------------------------------

// Complete is all or nothing across items (found here, fixed in 8485d5a):
// an item whose insert names pages the session does not hold, or a page
// that another item of the call inserts or frees, used to fail only when its
// turn came -- after the earlier items were inserted, unlocked and freed --
// so the client saw an error, never the earlier items' results, and a retry
// of the fixed call failed on their released handles.
TEST_F(StreamAbuseTest, CompleteIsAllOrNothingAcrossItems) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string a_id = Open(v1::ROLE_SCHEDULER);
  const std::string b_id = Open(v1::ROLE_SCHEDULER);
  Cache(a_id, Seq(0, 2 * kPage));
  const std::vector<int32_t> first = Seq(0, 3 * kPage);
  const std::vector<int32_t> second = Seq(1000, 2 * kPage);
  const v1::AdmitResult one = AdmitOne(a_id, first);
  const v1::AdmitResult two = AdmitOne(a_id, second);
  const v1::AdmitResult theirs = AdmitOne(b_id, Seq(2000, 2 * kPage));
  ASSERT_NE(one.lock_handle(), 0u);
  // Item 1 caches its tokens in session B's pages.
  v1::CompleteRequest request;
  request.set_session_id(a_id);
  *request.add_items() = CompleteItemFor(one, first);
  v1::CompleteItem foreign = CompleteItemFor(two, second);
  foreign.clear_pages();
  foreign.mutable_pages()->Add(theirs.pages().begin(), theirs.pages().end());
  *request.add_items() = foreign;
  const Snapshot before = Snap();
  v1::CompleteResponse response;
  grpc::Status status = Complete(request, &response);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(Snap(), before)
      << "a refused Complete changed item 0 (inserted, unlocked, freed)";
  // Item 1 frees a page that item 0 inserts.
  const v1::AdmitResult three = AdmitOne(a_id, Seq(3000, 2 * kPage));
  const v1::AdmitResult four = AdmitOne(a_id, Seq(4000, 2 * kPage));
  v1::CompleteRequest overlap;
  overlap.set_session_id(a_id);
  *overlap.add_items() = CompleteItemFor(three, Seq(3000, 2 * kPage));
  v1::CompleteItem frees = CompleteItemFor(four, Seq(4000, 2 * kPage));
  frees.add_free_pages(three.pages(0));
  *overlap.add_items() = frees;
  const Snapshot before_overlap = Snap();
  status = Complete(overlap, &response);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(Snap(), before_overlap)
      << "a refused Complete inserted item 0 and inserted and unlocked item 1";
}

// The workers hear a backup that Admit prepared (fixed in d703423: Admit's
// backups were never tagged with their namespace in the EventHub, so the
// workers' Subscribe streams heard neither its backup_step nor its
// backup_ended although they acked its layers themselves).
TEST_F(StreamAbuseTest, WorkersHearAnAdmitBackup) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  std::vector<std::string> workers;
  std::vector<std::unique_ptr<Subscription>> subs;
  for (uint32_t rank = 0; rank < kCp; ++rank) {
    workers.push_back(Open(v1::ROLE_WORKER, rank));
    auto sub = Subscription::Open(stub_.get(), workers.back(), true);
    ASSERT_TRUE(sub.ok()) << sub.status();
    subs.push_back(*std::move(sub));
  }
  const std::vector<int32_t> tokens = Seq(0, 3 * kPage);
  const v1::AdmitResult a =
      AdmitOne(scheduler, tokens, 0, v1::BACKUP_CHOICE_ALWAYS);
  const uint64_t backup = a.backup_id();
  ASSERT_NE(backup, 0u);
  // Each worker acks its own rank's layers on its own stream.
  for (uint32_t rank = 0; rank < kCp; ++rank) {
    BackupStream stream(stub_.get(), workers[rank]);
    for (uint32_t step = 0; step < kSteps; ++step) {
      ASSERT_TRUE(stream.LayerStored({backup}, step));
    }
    ASSERT_TRUE(stream.Close().ok());
    EXPECT_TRUE(stream.Errors().empty());
  }
  v1::CompleteResponse response;
  ASSERT_TRUE(
      CompleteOne(scheduler, CompleteItemFor(a, tokens), &response).ok());
  EXPECT_TRUE(response.results(0).backup_attached());
  for (uint32_t rank = 0; rank < kCp; ++rank) {
    const bool heard = subs[rank]->WaitFor(
        [&](const auto& events) {
          int steps = 0;
          bool ended = false;
          for (const v1::WorkerEvent& e : events) {
            steps += e.has_backup_step() &&
                     e.backup_step().backup_id() == backup && e.rank() == rank;
            ended |= e.has_backup_ended() &&
                     e.backup_ended().backup_id() == backup &&
                     e.backup_ended().committed();
          }
          return steps == static_cast<int>(kSteps) && ended;
        },
        absl::Seconds(3));
    EXPECT_TRUE(heard) << "worker " << rank << " heard " << subs[rank]->count()
                       << " events of the Admit backup " << backup
                       << " (expected " << kSteps
                       << " backup_step and its backup_ended)";
  }
}

// A deferred insert changes nothing, its backup included (it used to be
// rolled back and forgotten, so the documented retry of the item was refused
// with "backup_id N is not a backup of this session").
TEST_F(StreamAbuseTest, DeferredCompleteKeepsItsBackupForTheRetry) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  // Two requests sharing a prefix with a sub-page tail, both admitted
  // before either completes: nothing is cached yet, both get a backup.
  const std::vector<int32_t> shorter = Seq(0, 2 * kPage + 2);
  std::vector<int32_t> longer = shorter;
  for (int32_t t : Seq(100, kPage + 2)) longer.push_back(t);
  const v1::AdmitResult y =
      AdmitOne(scheduler, longer, 0, v1::BACKUP_CHOICE_ALWAYS);
  const v1::AdmitResult x =
      AdmitOne(scheduler, shorter, 0, v1::BACKUP_CHOICE_ALWAYS);
  ASSERT_NE(y.backup_id(), 0u);
  ASSERT_NE(x.backup_id(), 0u);
  ASSERT_FALSE(y.tail_blocked());
  // The shorter one completes first: its node's backup is in flight.
  v1::CompleteResponse response;
  ASSERT_TRUE(
      CompleteOne(scheduler, CompleteItemFor(x, shorter), &response).ok());
  ASSERT_TRUE(response.results(0).backup_attached());
  // The longer one runs past that node's tail: deferred.
  const v1::CompleteItem retry = CompleteItemFor(y, longer);
  ASSERT_TRUE(CompleteOne(scheduler, retry, &response).ok());
  ASSERT_TRUE(response.results(0).deferred());
  EXPECT_EQ(Stats().backups_rolled_back(), 0)
      << "the deferred item's backup was rolled back";
  // The blocking backup commits; the retry must go through.
  {
    BackupStream stream(stub_.get(), scheduler);
    for (uint32_t step = 0; step < kSteps; ++step) {
      ASSERT_TRUE(stream.LayerStored({x.backup_id()}, step));
    }
    ASSERT_TRUE(stream.Close().ok());
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Stats().pending_backups() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(Stats().pending_backups(), 0);
  grpc::Status status = CompleteOne(scheduler, retry, &response);
  EXPECT_TRUE(status.ok()) << "the documented retry of a deferred Complete "
                              "is refused: "
                           << status.error_message();
  if (status.ok()) EXPECT_FALSE(response.results(0).deferred());
}

// The compute-owner pattern covers the input's new pages only; the output
// reserve takes any lanes (it used to be laid over input + reserve, so with
// a reserve ranks would have had to write KV into pages other ranks own).
TEST_F(StreamAbuseTest, AdmitZigzagCoversTheInputOnly) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  v1::AdmitRequest request;
  request.set_session_id(scheduler);
  v1::AdmitItem* item = request.add_items();
  item->set_tokens(Pack(Seq(0, 8 * kPage)));
  item->set_reserve_tokens(8 * kPage);
  item->set_mode(v1::COMPUTE_OWNER_MODE_ZIGZAG);
  item->set_backup(v1::BACKUP_CHOICE_NEVER);
  v1::AdmitResponse response;
  ASSERT_TRUE(Admit(request, &response).ok());
  const v1::AdmitResult& a = response.results(0);
  ASSERT_EQ(a.pages_size(), 16);
  std::vector<uint32_t> input_lanes;
  for (int i = 0; i < 8; ++i) input_lanes.push_back(a.pages(i) % kCp);
  // Without a reserve the same input gets exactly this split.
  EXPECT_EQ(input_lanes, (std::vector<uint32_t>{0, 0, 1, 1, 1, 1, 0, 0}))
      << "the input pages' lanes follow the zigzag of input + reserve";
}

}  // namespace
}  // namespace hicache
