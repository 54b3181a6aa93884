#pragma once

// The C++ client of a hicached session (API v1.1, docs/api.md):
//
//   Session        one session (scheduler or worker) with a background
//                  keep-alive; typed unary calls: pages, tree, locks by
//                  handle, Admit / Complete, fences, FinishLoad, and the
//                  blocking LoadBack helpers.
//   BackupStream   the session's BackupSession bidi stream: prepare,
//                  layer_stored (with rank fences), store_all, rollback, and
//                  the server's prepared / step_done / committed /
//                  rolled_back / error messages.
//   ServerStream   a server stream read event by event: LoadStream
//                  (LoadBack) and WorkerEvents (a worker's Subscribe).
//
// Errors are absl::Status with the gRPC code and the daemon's message,
// prefixed with the call ("Unlock: "); a CP group follower's refusal also
// names the leader (LeaderOf in client/cpp/leader_redirect.h). Unary calls and the blocking
// LoadBack helpers have a 30 s deadline; the streams none (Cancel them).

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cpp/hicache_client.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/sync_stream.h"
#include "hicache/v1/hicache.grpc.pb.h"

namespace hicache::client {

// A shared-memory pool segment mapped into this process (CPU backend).
// Unmapped on destruction.
class MappedSegment {
 public:
  static absl::StatusOr<std::unique_ptr<MappedSegment>> Map(
      const v1::PoolSegment& segment);
  ~MappedSegment();
  MappedSegment(const MappedSegment&) = delete;
  MappedSegment& operator=(const MappedSegment&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  MappedSegment(uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  uint8_t* const data_;
  const uint64_t size_;
};

// Packs token ids as the API carries them (little-endian int32 bytes).
std::string PackTokens(const std::vector<int32_t>& tokens);

// Byte offset of (physical page, family, layer) in a rank's device segment:
// one region per (family, layer), families then layers in order, page p of a
// region at p * page_size * bytes_per_token (docs/cp-layout.md).
uint64_t DeviceBlockOffset(const v1::GetLayoutResponse& layout,
                           int64_t physical_page, int family, uint32_t layer);
uint64_t BlockBytes(const v1::GetLayoutResponse& layout, int family);

// An Admit item: the request's input `tokens`, `reserve_tokens` of output to
// allocate pages for now, the lanes of the new pages, the backup choice,
// and whether it is a middle chunk of a chunked prefill (`unfinished`: its
// backup covers only its whole pages, as its unfinished Complete keeps).
v1::AdmitItem MakeAdmitItem(
    const std::vector<int32_t>& tokens, int64_t reserve_tokens = 0,
    v1::ComputeOwnerMode mode = v1::COMPUTE_OWNER_MODE_UNSPECIFIED,
    v1::BackupChoice backup = v1::BACKUP_CHOICE_AUTO, bool unfinished = false);

// The Complete item that caches `tokens` (a prefix of what the request
// computed: its input, or input plus output) for an admitted request:
// pages = the first ceil(len(tokens) / page_size) of device.pages + pages,
// the admission's backup and lock handle, free_uncached, and the request's
// remaining pages (e.g. the unused output reserve) in free_pages.
// `admitted` must be admitted (not `load`), and `tokens` at least its hit.
v1::CompleteItem MakeCompleteItem(const v1::AdmitResult& admitted,
                                  const std::vector<int32_t>& tokens,
                                  uint32_t page_size, bool unfinished = false);

// How MatchPrefix matches (see MatchPrefixRequest).
struct MatchOptions {
  bool lock = false;        // Lock each device hit; results carry handles.
  bool peek = false;        // Inspection only: no hit counted.
  bool exact_tail = false;  // Report an exact sub-page tail (reading only).
};

// One LoadBack item: the request's tokens and its own extend (new input past
// the hit plus its output reserve): the load is a miss ("over_quota") unless
// the device keeps room for ceil(extend_tokens / P) + 1 pages besides it.
struct LoadItem {
  std::vector<int32_t> tokens;
  int64_t extend_tokens = 0;
};

// The outcome of one LoadBack item, read to its terminal `done`.
struct LoadResult {
  v1::LoadBackEvent::Started started;
  v1::LoadBackEvent::Done done;
  int layers_loaded = 0;  // layer_loaded events of this item's load.

  // True when the device hit (and the load, if any) is usable.
  bool ok() const { return done.ok(); }
  uint64_t load_id() const { return started.load_id(); }
  // The lock the session now holds for this item (0: none): the loaded
  // node's (done.lock_handle) or, with nothing loaded, the device hit's
  // (started.lock_handle). Release with Session::UnlockHandles.
  uint64_t lock_handle() const {
    return done.lock_handle() != 0 ? done.lock_handle()
                                   : started.lock_handle();
  }
};

// A server stream read event by event (LoadBack, Subscribe). It has no
// deadline: Next() blocks until an event, the end, or Cancel(); one reader
// at a time. Cancel() may be called from any thread and makes a
// blocked Next() return false. The destructor cancels and finishes a stream
// that was not read to its end.
template <typename Event>
class ServerStream {
 public:
  ServerStream() = default;
  ServerStream(const ServerStream&) = delete;
  ServerStream& operator=(const ServerStream&) = delete;
  ~ServerStream() {
    if (reader_ != nullptr && !finished_) {
      context_.TryCancel();
      Event ignored;
      while (reader_->Read(&ignored)) {
      }
      (void)reader_->Finish();
    }
  }

  // The next event, or false at the end of the stream (then Finish()).
  bool Next(Event* event) { return reader_->Read(event); }
  // The stream's final status; call once Next() returned false.
  absl::Status Finish() {
    finished_ = true;
    const grpc::Status s = reader_->Finish();
    if (s.ok()) return absl::OkStatus();
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        name_ + ": " + s.error_message());
  }
  void Cancel() { context_.TryCancel(); }

 private:
  friend class Session;
  std::string name_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<Event>> reader_;
  bool finished_ = false;
};
// started (one per item), layer_loaded..., done (one per item).
using LoadStream = ServerStream<v1::LoadBackEvent>;
// A worker's own events (subscribed first, then backup steps, loaded layers
// and outcomes of its namespace).
using WorkerEvents = ServerStream<v1::WorkerEvent>;

class BackupStream;

// An open session with a background keep-alive. Close() (or destruction)
// ends it; a process that dies without closing is cleaned up by the daemon
// when the lease lapses. Retries are gRPC's, from the stub's channel: made
// by HiCacheClient::NewChannel, its service config retries GetLayout and
// KeepAlive on UNAVAILABLE; a Match without lock waits for the connection
// (wait_for_ready); nothing that changes the daemon's state is retried.
// Thread-safe.
//
// Roles: scheduler sessions make every call here; worker sessions keep
// alive, read the layout, register fences, Subscribe, and open their own
// BackupStream to ack their rank's layers.
class Session {
 public:
  // `wait_for_daemon` > 0: OpenSession waits (wait_for_ready) up to that
  // long for a daemon that is not listening yet; 0 fails fast (UNAVAILABLE).
  // A refusal by a CP group follower carries the leader's target (LeaderOf
  // in client/cpp/leader_redirect.h); Open does not follow it (OpenAt does).
  static absl::StatusOr<std::unique_ptr<Session>> Open(
      std::shared_ptr<v1::HiCache::Stub> stub, const std::string& client_name,
      v1::Role role, uint32_t rank, const std::string& ns,
      absl::Duration lease = absl::Seconds(10),
      absl::Duration wait_for_daemon = absl::ZeroDuration());

  // Open on the daemon at `target` (a channel of
  // HiCacheClient::NewChannel(target, options)), following a CP group
  // redirect: when `target` is a follower that refuses the session (a
  // scheduler's) and names its leader, the session is opened on the leader
  // instead, over a new channel with the same `options` (TLS, server name,
  // client certificate). `options` are for TCP targets: a `unix:` target
  // (a local follower) is opened without them, its leader with them. At most one hop: a leader that redirects again is
  // FAILED_PRECONDITION naming both. `opened_at` (optional) receives the
  // target the session lives on.
  static absl::StatusOr<std::unique_ptr<Session>> OpenAt(
      const std::string& target, const ChannelOptions& options,
      const std::string& client_name, v1::Role role, uint32_t rank,
      const std::string& ns, absl::Duration lease = absl::Seconds(10),
      absl::Duration wait_for_daemon = absl::ZeroDuration(),
      std::string* opened_at = nullptr);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const std::string& id() const { return id_; }
  v1::HiCache::Stub& stub() { return *stub_; }

  absl::StatusOr<v1::GetLayoutResponse> GetLayout();

  // --- Pages ---------------------------------------------------------------
  absl::StatusOr<v1::AllocateResponse> Allocate(
      const std::vector<v1::AllocateItem>& items);
  absl::Status Free(const std::vector<int64_t>& pages);

  // --- Tree and locks ------------------------------------------------------
  // MatchPrefix of each request. With options.lock each result's
  // lock_handle is its own lock on the device hit (0: nothing hit).
  absl::StatusOr<v1::MatchPrefixResponse> MatchPrefix(
      const std::vector<std::vector<int32_t>>& requests,
      const MatchOptions& options = {});
  // v1.0 form: MatchPrefix with only `lock`.
  absl::StatusOr<v1::MatchPrefixResponse> Match(
      const std::vector<std::vector<int32_t>>& requests, bool lock);
  // The non-zero lock handles of a locked match, in result order.
  static std::vector<uint64_t> LockHandles(
      const v1::MatchPrefixResponse& response);

  absl::StatusOr<v1::InsertResponse> Insert(const v1::InsertRequest& request);
  // One lock per node; returns one handle per node, in order.
  absl::StatusOr<std::vector<uint64_t>> Lock(const std::vector<uint64_t>& nodes);
  // Releases exactly these locks. A repeated, released or foreign handle is
  // an error (INVALID_ARGUMENT / NOT_FOUND) and releases nothing.
  absl::Status UnlockHandles(const std::vector<uint64_t>& handles);
  // v1.0 form: one lock per listed node.
  absl::Status Unlock(const std::vector<uint64_t>& nodes);

  // --- One round trip before the forward, one after -----------------------
  // Match + lock + allocate the extend (+ prepare the backup), per item in
  // order; see AdmitRequest. Items that do not fit answer admitted = false.
  absl::StatusOr<v1::AdmitResponse> Admit(
      const std::vector<v1::AdmitItem>& items);
  // Insert + attach backup + unlock handles + free, per item (see
  // CompleteRequest, and MakeCompleteItem). A deferred item changed nothing.
  absl::StatusOr<v1::CompleteResponse> Complete(
      const std::vector<v1::CompleteItem>& items);

  // --- Load-back -----------------------------------------------------------
  // Starts a LoadBack stream (one request, or a batch in `items`); the
  // request's session id is filled in. Read it to every item's `done`.
  absl::StatusOr<std::unique_ptr<LoadStream>> StartLoadBack(
      const v1::LoadBackRequest& request);
  // Loads one request back (the `tokens` form) and reads its stream to the
  // end. A stream error or a missing `done` is an error; a miss is not
  // (see LoadResult::ok and started.miss_reason).
  absl::StatusOr<LoadResult> LoadBack(const std::vector<int32_t>& tokens,
                                      int64_t extend_tokens = 0);
  // A batch over one stream: one result per item, in order.
  absl::StatusOr<std::vector<LoadResult>> LoadBack(
      const std::vector<LoadItem>& items);
  // Abandons a running load of this session (its stream ends with
  // done(ok=false)) or releases one its stream has not handed over.
  absl::Status FinishLoad(uint64_t load_id);

  // --- Streams -------------------------------------------------------------
  // This session's BackupSession stream.
  absl::StatusOr<std::unique_ptr<BackupStream>> OpenBackupStream();
  // A worker session's own events. Returns once the subscription is live
  // (the daemon's `subscribed` marker was read): nothing later is missed.
  absl::StatusOr<std::unique_ptr<WorkerEvents>> Subscribe();

  // --- Fences (CUDA backend; FAILED_PRECONDITION on the CPU backend) -------
  // Registers a worker's "layer written" event (64 cudaIpcEventHandle_t
  // bytes) for `rank`; returns the fence id to name in layer_stored.
  absl::StatusOr<uint64_t> RegisterFence(uint32_t rank,
                                         const std::string& event_handle);
  absl::Status ReleaseFence(uint64_t fence_id);

  absl::StatusOr<v1::CloseSessionResponse> Close();

 private:
  Session(std::shared_ptr<v1::HiCache::Stub> stub, std::string id,
          absl::Duration lease);

  std::shared_ptr<v1::HiCache::Stub> stub_;
  const std::string id_;
  std::atomic<bool> closed_{false};
  std::thread keep_alive_;
};

// What one BackupStream has heard about one backup.
struct BackupProgress {
  int steps_done = 0;    // step_done messages (one per rank and step).
  bool committed = false;
  uint64_t node = 0;     // With committed.
  bool rolled_back = false;
  bool ended() const { return committed || rolled_back; }
};

// One session's BackupSession stream (scheduler or worker).
//
// Threading: writes (SendPrepare, LayerStored, StoreAll, Rollback) may come
// from any thread, also while another thread reads. Reads -- Prepare (which
// writes, then reads), Next, WaitCommitted, WaitSteps, Close -- from one
// thread at a time. Cancel() from any thread.
//
// Every message read is applied to Progress(); messages a helper (Prepare,
// WaitCommitted, WaitSteps) reads past are kept, in order, for Next(). A
// caller that never calls Next() can drop them with ClearBuffered().
//
// Errors: the daemon answers a bad message with an `error` message and the
// stream goes on. It handles messages in order, so an error read while
// Prepare waits for its `prepared` is taken as the prepare's; an error of an
// earlier layer_stored not yet read would be attributed to it too. Errors
// other helpers read are kept in TakeErrors().
//
// Destruction without Close() cancels the stream: the daemon rolls back its
// uncommitted backups.
class BackupStream {
 public:
  ~BackupStream();
  BackupStream(const BackupStream&) = delete;
  BackupStream& operator=(const BackupStream&) = delete;

  // Sends prepare(specs) and reads to its `prepared`: one backup id per spec
  // (0: skipped, the host tier is full). An `error` first is the failure.
  absl::StatusOr<std::vector<uint64_t>> Prepare(
      const std::vector<v1::BackupSpec>& specs);
  // Sends prepare(specs) only; its `prepared` arrives through Next().
  absl::Status SendPrepare(const std::vector<v1::BackupSpec>& specs);
  // Layer `step` of these backups is written (scheduler: every rank; worker:
  // its own rank). `fences` (CUDA): per rank, the fence whose latest record
  // marks the layer written.
  absl::Status LayerStored(const std::vector<uint64_t>& backup_ids,
                           uint32_t step,
                           const std::vector<v1::RankFence>& fences = {});
  absl::Status StoreAll(uint64_t backup_id);
  absl::Status Rollback(uint64_t backup_id);

  // The next server message (kept ones first), or the stream's end: the
  // stream's final status if it failed, else OUT_OF_RANGE.
  absl::StatusOr<v1::BackupServerMessage> Next();
  // Reads until `backup_id` commits; returns its node. ABORTED if it was
  // rolled back; the stream's error if it ends first.
  absl::StatusOr<uint64_t> WaitCommitted(uint64_t backup_id);
  // Reads until `backup_id` has `steps_done` step_done messages (or ended).
  absl::Status WaitSteps(uint64_t backup_id, int steps_done);

  BackupProgress Progress(uint64_t backup_id) const;
  // Forgets the progress of backups that ended (a long-lived stream).
  void ForgetEnded();
  std::vector<v1::BackupServerMessage::Error> TakeErrors();
  void ClearBuffered();

  // Half-closes, reads the rest (backups that still need this client are
  // rolled back by the daemon; the others are delivered as they commit) and
  // returns the stream's status. Idempotent.
  absl::Status Close();
  void Cancel() { context_.TryCancel(); }

 private:
  friend class Session;
  explicit BackupStream(std::string session_id) : session_id_(session_id) {}
  absl::Status Write(v1::BackupClientMessage& message);
  // Reads one message from the wire into *message and applies it.
  absl::Status ReadWire(v1::BackupServerMessage* message);
  absl::Status EndOfStream();
  // Reads (keeping what it reads) until done(Progress(backup_id)).
  absl::Status WaitFor(uint64_t backup_id,
                       absl::FunctionRef<bool(const BackupProgress&)> done);
  void Apply(const v1::BackupServerMessage& message);

  const std::string session_id_;
  grpc::ClientContext context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::BackupClientMessage, v1::BackupServerMessage>>
      stream_;
  absl::Mutex write_mu_;
  bool writes_done_ ABSL_GUARDED_BY(write_mu_) = false;
  mutable absl::Mutex state_mu_;
  std::map<uint64_t, BackupProgress> progress_ ABSL_GUARDED_BY(state_mu_);
  std::vector<v1::BackupServerMessage::Error> errors_ ABSL_GUARDED_BY(
      state_mu_);
  // Reader-only state (one reader at a time).
  std::deque<v1::BackupServerMessage> buffered_;
  bool ended_ = false;
  bool finished_ = false;
  absl::Status final_status_;
};

}  // namespace hicache::client
