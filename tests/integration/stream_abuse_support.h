#pragma once

// The shared part of the stream_abuse_*_test files: what a buggy or hostile
// client can do to the streams and the request calls of a real hicached
// process, each answered with a clear error and no change or leak.
//  * stream_abuse_subscribe_test: a worker's Subscribe stream cancelled, or
//    its process killed, while events flow, or left unread until its backlog
//    overflows;
//  * stream_abuse_backup_test: layer_stored with absurd lists, BackupSession
//    streams going away or naming another session;
//  * stream_abuse_request_test: LoadBack, Admit and Complete with absurd or
//    foreign arguments;
//  * stream_abuse_regression_test: bugs found while writing these (each now
//    a regression test).
// Here: the daemon's settings, a BackupSession and a Subscribe stream with
// reader threads, and the fixture that runs the daemon and calls it.
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace hicache::stream_abuse_testing {

inline constexpr int64_t kPage = 4;    // --page_size
inline constexpr uint32_t kCp = 2;     // --cp_size
inline constexpr uint32_t kSteps = 2;  // --kv_preset=tiny: 2 target layers.
inline constexpr int64_t kItemLimit = 4096;  // --max_items_per_request
inline constexpr int kMaxStreams = 2;        // --max_streams_per_session
// --max_tokens_per_request
inline constexpr int64_t kTokenLimit = int64_t{1} << 24;
inline constexpr char kNs[] = "abuse";

// A channel with a connection of its own (no subchannel sharing), so one
// client's streams never ride on another's connection.
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& socket,
                                          grpc::ChannelArguments args = {});

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

std::ostream& operator<<(std::ostream& os, const Snapshot& s);

// A BackupSession stream: a reader thread collects the server's messages.
class BackupStream {
 public:
  BackupStream(v1::HiCache::Stub* stub, std::string session);
  ~BackupStream();

  // Sends `message` with this stream's session id.
  bool Send(v1::BackupClientMessage message);
  bool LayerStored(const std::vector<uint64_t>& ids, uint32_t step);

  // Waits until `done(messages)` holds or the stream ended; returns whether
  // it holds.
  bool WaitFor(const std::function<
                   bool(const std::vector<v1::BackupServerMessage>&)>& done,
               absl::Duration timeout = absl::Seconds(20));
  std::vector<v1::BackupServerMessage> Messages();
  std::vector<v1::BackupServerMessage::Error> Errors();
  // The next error after the first `seen`.
  std::optional<v1::BackupServerMessage::Error> WaitError(size_t seen);
  static int64_t StepsDone(const std::vector<v1::BackupServerMessage>& messages,
                           uint64_t id);
  int64_t StepsDone(uint64_t id) { return StepsDone(Messages(), id); }
  // prepare(specs) -> the ids of `prepared`.
  std::vector<uint64_t> Prepare(const std::vector<v1::BackupSpec>& specs);
  size_t Count(bool (v1::BackupServerMessage::*has)() const, bool lock = true);
  bool ended();

  // Half-closes and waits for the server's end.
  grpc::Status Close();

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
      v1::HiCache::Stub* stub, const std::string& session, bool background);
  // Opens, retrying while the session's stream slots are taken (a slot of
  // a stream that just went away is freed once the daemon notices).
  static absl::StatusOr<std::unique_ptr<Subscription>> OpenWhenFree(
      v1::HiCache::Stub* stub, const std::string& session, bool background,
      absl::Duration timeout = absl::Seconds(15));

  ~Subscription();

  // Reads one event in the foreground (no background thread).
  bool Read(v1::WorkerEvent* event) { return reader_->Read(event); }
  void Cancel() { context_.TryCancel(); }
  // Waits for the end of the stream and returns its status.
  grpc::Status Finish();

  int64_t count();
  bool ended();
  bool WaitFor(
      const std::function<bool(const std::vector<v1::WorkerEvent>&)>& done,
      absl::Duration timeout = absl::Seconds(10));
  bool WaitCount(int64_t n, absl::Duration timeout = absl::Seconds(10));

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

// A real hicached (--cp_size=kCp, --page_size=kPage, --kv_preset=tiny,
// --max_streams_per_session=kMaxStreams) on a socket in a temporary
// directory, started by each test with StartDaemon; this process is its
// client. TearDown expects the daemon to have survived and to exit 0 on
// SIGTERM.
class StreamAbuseTest : public ::testing::Test {
 protected:
  void StartDaemon(std::vector<std::string> extra = {});

  void TearDown() override;

  std::string Open(v1::Role role, uint32_t rank = 0,
                   const std::string& ns = kNs);

  v1::CacheStats Stats();

  Snapshot Snap();

  // Sessions as ListSessions (an operator RPC: the test runs as root)
  // reports them.
  int ListedSessions();

  std::vector<int64_t> Allocate(const std::string& session, int64_t n);

  grpc::Status Admit(const v1::AdmitRequest& request,
                     v1::AdmitResponse* response);
  v1::AdmitResult AdmitOne(const std::string& session,
                           const std::vector<int32_t>& tokens,
                           int64_t reserve = 0,
                           v1::BackupChoice backup = v1::BACKUP_CHOICE_NEVER);
  grpc::Status Complete(const v1::CompleteRequest& request,
                        v1::CompleteResponse* response);
  // The Complete item that caches `tokens` (the admitted input), releases
  // the admission's lock and frees the rest of its pages.
  static v1::CompleteItem CompleteItemFor(const v1::AdmitResult& a,
                                          const std::vector<int32_t>& tokens);
  grpc::Status CompleteOne(const std::string& session,
                           const v1::CompleteItem& item,
                           v1::CompleteResponse* response = nullptr);
  // Caches `tokens` on device (no backup) for `session`; returns its node.
  uint64_t Cache(const std::string& session,
                 const std::vector<int32_t>& tokens);

  grpc::Status Unlock(const std::string& session,
                      const std::vector<uint64_t>& handles);

  // A LoadBack stream read to its end.
  struct LoadBackRun {
    std::vector<v1::LoadBackEvent> events;
    grpc::Status status;
  };
  LoadBackRun LoadBack(const v1::LoadBackRequest& request);

  // Caches `tokens` with a committed host copy, then evicts its device copy
  // (the operator's Evict): a host-only hit.
  void CacheOnHostOnly(const std::string& scheduler,
                       const std::vector<int32_t>& tokens);

  // Events for the workers of kNs: `pages.size()` one-page backups prepared
  // on the scheduler's `stream`, every step stored, every step_done awaited,
  // then each rolled back. Each worker hears pages.size() * kSteps
  // backup_step and pages.size() backup_ended events.
  void Churn(BackupStream& stream, const std::vector<int64_t>& pages);

  // Asserts that `session` can hold kMaxStreams Subscribe streams at once
  // (no slot leaked by an earlier stream) and not one more.
  void ExpectEveryStreamSlotFree(const std::string& session);

  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("hicached.sock");
  std::optional<testing::Subprocess> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::HiCache::Stub> stub_;
};

}  // namespace hicache::stream_abuse_testing
