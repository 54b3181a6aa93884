#pragma once

// Framing of Communicator frames (communicator.h) into fixed-capacity
// transport messages, for transports that move bounded messages rather than
// a byte stream (Gloo's unbound buffers: a receive must be posted with a
// size at least that of the message, and the receiver is not told how many
// bytes arrived).
//
// Wire format (little-endian), one message:
//   u32 payload_bytes                 bytes of chunks that follow
//   chunk*:  u32 header               bit 31: this chunk ends its frame;
//                                     bits 0-30: chunk bytes
//            u8[chunk bytes]
// A frame is the concatenation of its chunks, the last with bit 31 set; an
// empty frame is one empty chunk with bit 31 set. Small frames share a
// message; a large one spans several. Both ends must use the same message
// capacity (it is part of the wire format).
//
// Not thread-safe: one MessagePacker per sending thread, one FrameAssembler
// per receiving thread.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/comm/communicator.h"

namespace hicache::comm {

inline constexpr size_t kMessageHeaderBytes = 4;
inline constexpr size_t kChunkHeaderBytes = 4;
inline constexpr uint32_t kLastChunkBit = uint32_t{1} << 31;

// Packs queued frames into messages, fragmenting those that do not fit.
class MessagePacker {
 public:
  // `capacity`: bytes of one message, header included (>= 64).
  explicit MessagePacker(size_t capacity);

  // Appends a frame to pack (frames leave in the order they were pushed).
  void Push(std::string frame) { pending_.push_back(std::move(frame)); }
  bool empty() const { return pending_.empty(); }
  size_t pending_frames() const { return pending_.size(); }

  // Writes the next message into `out` (at least capacity bytes) and
  // returns its length in bytes (header included). REQUIRES: !empty().
  size_t Pack(char* out);

 private:
  const size_t capacity_;
  std::deque<std::string> pending_;
  size_t front_offset_ = 0;  // Bytes of pending_.front() already packed.
};

// Reassembles frames from messages, validating every length against the
// bytes that arrived and the frame limit: a malformed message is DATA_LOSS
// and the assembler must not be used again (the link is to be failed).
class FrameAssembler {
 public:
  explicit FrameAssembler(size_t max_frame_bytes = kMaxFrameBytes)
      : max_frame_bytes_(max_frame_bytes) {}

  // `message` holds `available` bytes (the receive buffer); the message's
  // own header says how many of them are its. Complete frames are appended
  // to `frames`, in order.
  absl::Status Consume(const char* message, size_t available,
                       std::vector<std::string>* frames);

  // True while a frame has begun and not ended.
  bool mid_frame() const { return mid_frame_; }

 private:
  const size_t max_frame_bytes_;
  std::string partial_;
  bool mid_frame_ = false;
};

}  // namespace hicache::comm
