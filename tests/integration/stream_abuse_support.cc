#include "tests/integration/stream_abuse_support.h"

#include <signal.h>

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/endpoint.h"
#include "gmock/gmock.h"
#include "tests/testing/binaries.h"
#include "tests/testing/tokens.h"

namespace hicache::stream_abuse_testing {
namespace {

using testing::DaemonPath;
using ::testing::HasSubstr;
using testing::Pack;
using testing::Subprocess;

void Deadline(grpc::ClientContext* context,
              absl::Duration timeout = absl::Seconds(20)) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace

std::shared_ptr<grpc::Channel> OwnChannel(const std::string& socket,
                                          grpc::ChannelArguments args) {
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(client::UnixTarget(socket),
                                   grpc::InsecureChannelCredentials(), args);
}

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

BackupStream::BackupStream(v1::HiCache::Stub* stub, std::string session)
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

BackupStream::~BackupStream() {
  if (!finished_) {
    context_.TryCancel();
    reader_.join();
    (void)stream_->Finish();
  }
}

bool BackupStream::Send(v1::BackupClientMessage message) {
  if (message.session_id().empty()) message.set_session_id(session_);
  std::lock_guard<std::mutex> lock(write_mu_);
  return stream_->Write(message);
}

bool BackupStream::LayerStored(const std::vector<uint64_t>& ids,
                               uint32_t step) {
  v1::BackupClientMessage message;
  auto* stored = message.mutable_layer_stored();
  stored->mutable_backup_ids()->Add(ids.begin(), ids.end());
  stored->set_step(step);
  return Send(message);
}

bool BackupStream::WaitFor(
    const std::function<bool(const std::vector<v1::BackupServerMessage>&)>&
        done,
    absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] {
    return done(messages_) || ended_;
  }) && done(messages_);
}

std::vector<v1::BackupServerMessage> BackupStream::Messages() {
  std::lock_guard<std::mutex> lock(mu_);
  return messages_;
}

std::vector<v1::BackupServerMessage::Error> BackupStream::Errors() {
  std::vector<v1::BackupServerMessage::Error> errors;
  for (const auto& m : Messages()) {
    if (m.has_error()) errors.push_back(m.error());
  }
  return errors;
}

std::optional<v1::BackupServerMessage::Error> BackupStream::WaitError(
    size_t seen) {
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

int64_t BackupStream::StepsDone(
    const std::vector<v1::BackupServerMessage>& messages, uint64_t id) {
  int64_t n = 0;
  for (const auto& m : messages) {
    n += m.has_step_done() && m.step_done().backup_id() == id;
  }
  return n;
}

std::vector<uint64_t> BackupStream::Prepare(
    const std::vector<v1::BackupSpec>& specs) {
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

size_t BackupStream::Count(bool (v1::BackupServerMessage::*has)() const,
                           bool lock) {
  size_t n = 0;
  if (lock) {
    for (const auto& m : Messages()) n += (m.*has)();
  } else {  // Called from a WaitFor predicate: mu_ is held.
    for (const auto& m : messages_) n += (m.*has)();
  }
  return n;
}

bool BackupStream::ended() {
  std::lock_guard<std::mutex> lock(mu_);
  return ended_;
}

grpc::Status BackupStream::Close() {
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    stream_->WritesDone();
  }
  reader_.join();
  finished_ = true;
  return stream_->Finish();
}

absl::StatusOr<std::unique_ptr<Subscription>> Subscription::Open(
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

absl::StatusOr<std::unique_ptr<Subscription>> Subscription::OpenWhenFree(
    v1::HiCache::Stub* stub, const std::string& session, bool background,
    absl::Duration timeout) {
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

Subscription::~Subscription() {
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

grpc::Status Subscription::Finish() {
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

int64_t Subscription::count() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(events_.size());
}

bool Subscription::ended() {
  std::lock_guard<std::mutex> lock(mu_);
  return ended_;
}

bool Subscription::WaitFor(
    const std::function<bool(const std::vector<v1::WorkerEvent>&)>& done,
    absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] {
    return done(events_) || ended_;
  }) && done(events_);
}

bool Subscription::WaitCount(int64_t n, absl::Duration timeout) {
  return WaitFor(
      [n](const auto& events) {
        return static_cast<int64_t>(events.size()) >= n;
      },
      timeout);
}

void StreamAbuseTest::StartDaemon(std::vector<std::string> extra) {
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

void StreamAbuseTest::TearDown() {
  if (daemon_.has_value()) {
    // The daemon must have survived every abuse.
    EXPECT_TRUE(daemon_->Running()) << daemon_->Stderr();
    stub_.reset();  // Our connection closes: nothing waits for the grace.
    channel_.reset();
    (void)daemon_->Signal(SIGTERM);
    absl::StatusOr<int> code = daemon_->Wait(absl::Seconds(30));
    EXPECT_TRUE(code.ok() && *code == 0)
        << (code.ok() ? absl::StrCat("exit ", *code) : code.status().ToString())
        << "\n"
        << daemon_->Stderr();
  }
}

std::string StreamAbuseTest::Open(v1::Role role, uint32_t rank,
                                  const std::string& ns) {
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::OpenSessionRequest request;
  request.set_client_name(role == v1::ROLE_WORKER ? absl::StrCat("worker", rank)
                                                  : std::string("scheduler"));
  request.set_role(role);
  request.set_rank(rank);
  request.set_namespace_(ns);
  v1::OpenSessionResponse response;
  grpc::Status status = stub_->OpenSession(&ctx, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.session_id();
}

v1::CacheStats StreamAbuseTest::Stats() {
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::CacheStats stats;
  EXPECT_TRUE(stub_->Stats(&ctx, v1::GetStatsRequest(), &stats).ok());
  return stats;
}

Snapshot StreamAbuseTest::Snap() {
  const v1::CacheStats s = Stats();
  Snapshot out{s.nodes(),         s.device_tokens(),   s.protected_tokens(),
               s.host_tokens(),   s.pending_backups(), s.backups_started(),
               s.loads_started(), s.session_locks(),   s.session_pages(),
               s.sessions(),      s.bytes_to_host(),   s.bytes_to_device()};
  for (const auto& lane : s.lanes()) out.allocated += lane.allocated();
  return out;
}

int StreamAbuseTest::ListedSessions() {
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::ListSessionsResponse response;
  grpc::Status status =
      stub_->ListSessions(&ctx, v1::ListSessionsRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.sessions_size();
}

std::vector<int64_t> StreamAbuseTest::Allocate(const std::string& session,
                                               int64_t n) {
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

grpc::Status StreamAbuseTest::Admit(const v1::AdmitRequest& request,
                                    v1::AdmitResponse* response) {
  grpc::ClientContext ctx;
  Deadline(&ctx);
  return stub_->Admit(&ctx, request, response);
}

v1::AdmitResult StreamAbuseTest::AdmitOne(const std::string& session,
                                          const std::vector<int32_t>& tokens,
                                          int64_t reserve,
                                          v1::BackupChoice backup) {
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
  return response.results_size() == 1 ? response.results(0) : v1::AdmitResult();
}

grpc::Status StreamAbuseTest::Complete(const v1::CompleteRequest& request,
                                       v1::CompleteResponse* response) {
  grpc::ClientContext ctx;
  Deadline(&ctx);
  return stub_->Complete(&ctx, request, response);
}

v1::CompleteItem StreamAbuseTest::CompleteItemFor(
    const v1::AdmitResult& a, const std::vector<int32_t>& tokens) {
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

grpc::Status StreamAbuseTest::CompleteOne(const std::string& session,
                                          const v1::CompleteItem& item,
                                          v1::CompleteResponse* response) {
  v1::CompleteRequest request;
  request.set_session_id(session);
  *request.add_items() = item;
  v1::CompleteResponse unused;
  return Complete(request, response != nullptr ? response : &unused);
}

uint64_t StreamAbuseTest::Cache(const std::string& session,
                                const std::vector<int32_t>& tokens) {
  const v1::AdmitResult a = AdmitOne(session, tokens);
  v1::CompleteResponse response;
  grpc::Status status =
      CompleteOne(session, CompleteItemFor(a, tokens), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.results_size() == 1 ? response.results(0).node() : 0;
}

grpc::Status StreamAbuseTest::Unlock(const std::string& session,
                                     const std::vector<uint64_t>& handles) {
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::LockRequest request;
  request.set_session_id(session);
  request.mutable_lock_handles()->Add(handles.begin(), handles.end());
  v1::LockResponse response;
  return stub_->Unlock(&ctx, request, &response);
}

StreamAbuseTest::LoadBackRun StreamAbuseTest::LoadBack(
    const v1::LoadBackRequest& request) {
  grpc::ClientContext ctx;
  Deadline(&ctx);
  LoadBackRun run;
  auto reader = stub_->LoadBack(&ctx, request);
  v1::LoadBackEvent event;
  while (reader->Read(&event)) run.events.push_back(event);
  run.status = reader->Finish();
  return run;
}

void StreamAbuseTest::CacheOnHostOnly(const std::string& scheduler,
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

void StreamAbuseTest::Churn(BackupStream& stream,
                            const std::vector<int64_t>& pages) {
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

void StreamAbuseTest::ExpectEveryStreamSlotFree(const std::string& session) {
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

}  // namespace hicache::stream_abuse_testing
