#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
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

// An open session with a background keep-alive. Close() (or destruction)
// ends it; a process that dies without closing is cleaned up by the daemon
// when the lease lapses. Idempotent calls (GetLayout, a Match without lock)
// are retried while the daemon is UNAVAILABLE. Thread-safe.
class Session {
 public:
  static absl::StatusOr<std::unique_ptr<Session>> Open(
      std::shared_ptr<v1::HiCache::Stub> stub, const std::string& client_name,
      v1::Role role, uint32_t rank, const std::string& ns,
      absl::Duration lease = absl::Seconds(10));
  ~Session();

  const std::string& id() const { return id_; }
  v1::HiCache::Stub& stub() { return *stub_; }

  absl::StatusOr<v1::GetLayoutResponse> GetLayout();
  absl::StatusOr<v1::AllocateResponse> Allocate(
      const std::vector<v1::AllocateItem>& items);
  absl::StatusOr<v1::MatchPrefixResponse> Match(
      const std::vector<std::vector<int32_t>>& requests, bool lock);
  absl::StatusOr<v1::InsertResponse> Insert(const v1::InsertRequest& request);
  absl::Status Unlock(const std::vector<uint64_t>& nodes);
  absl::StatusOr<v1::CloseSessionResponse> Close();

 private:
  Session(std::shared_ptr<v1::HiCache::Stub> stub, std::string id,
          absl::Duration lease);

  std::shared_ptr<v1::HiCache::Stub> stub_;
  const std::string id_;
  std::atomic<bool> closed_{false};
  std::thread keep_alive_;
};

}  // namespace hicache::client
