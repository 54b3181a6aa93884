#include "daemon/comm/message_framing.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/core/check.h"
#include "daemon/core/le_bytes.h"

namespace hicache::comm {
namespace {

// Writes `v` at `out`, little-endian (a header, once its value is known).
void PutU32(char* out, uint32_t v) {
  std::string bytes;
  LeWriter(&bytes).U32(v);
  std::memcpy(out, bytes.data(), bytes.size());
}

}  // namespace

MessagePacker::MessagePacker(size_t capacity) : capacity_(capacity) {
  HICACHE_CHECK(
      capacity >= 64 && capacity - kMessageHeaderBytes < size_t{kLastChunkBit},
      "message capacity out of range");
}

size_t MessagePacker::Pack(char* out) {
  HICACHE_CHECK(!pending_.empty(), "Pack with nothing to pack");
  size_t used = kMessageHeaderBytes;
  while (!pending_.empty() && capacity_ - used >= kChunkHeaderBytes) {
    const std::string& frame = pending_.front();
    const size_t rest = frame.size() - front_offset_;
    const size_t take = std::min(rest, capacity_ - used - kChunkHeaderBytes);
    if (take == 0 && rest > 0) break;  // Only room for a header: next one.
    const bool last = take == rest;
    PutU32(out + used,
           static_cast<uint32_t>(take) | (last ? kLastChunkBit : 0));
    used += kChunkHeaderBytes;
    if (take > 0) std::memcpy(out + used, frame.data() + front_offset_, take);
    used += take;
    if (last) {
      pending_.pop_front();
      front_offset_ = 0;
    } else {
      front_offset_ += take;
      break;  // The message is full.
    }
  }
  PutU32(out, static_cast<uint32_t>(used - kMessageHeaderBytes));
  return used;
}

absl::Status FrameAssembler::Consume(const char* message, size_t available,
                                     std::vector<std::string>* frames) {
  LeReader in(absl::string_view(message, available));
  uint32_t payload = 0;
  if (!in.U32(&payload)) {
    return absl::DataLossError(absl::StrCat("malformed message: ", available,
                                            " bytes, shorter than its header"));
  }
  absl::string_view chunks;
  if (!in.Bytes(payload, &chunks)) {
    return absl::DataLossError(
        absl::StrCat("malformed message: header claims ", payload,
                     " bytes, at most ", in.remaining(), " can have arrived"));
  }
  LeReader rest(chunks);
  while (rest.remaining() > 0) {
    uint32_t header = 0;
    if (!rest.U32(&header)) {
      return absl::DataLossError(
          absl::StrCat("malformed message: ", rest.remaining(),
                       " stray bytes after the last chunk"));
    }
    const size_t len = header & ~kLastChunkBit;
    absl::string_view chunk;
    if (!rest.Bytes(len, &chunk)) {
      return absl::DataLossError(
          absl::StrCat("malformed message: chunk of ", len, " bytes, only ",
                       rest.remaining(), " left in the message"));
    }
    if (len > max_frame_bytes_ - partial_.size()) {
      return absl::DataLossError(absl::StrCat(
          "malformed message: frame grows past ", max_frame_bytes_, " bytes"));
    }
    partial_.append(chunk.data(), chunk.size());
    mid_frame_ = true;
    if (header & kLastChunkBit) {
      frames->push_back(std::move(partial_));
      partial_.clear();
      mid_frame_ = false;
    }
  }
  return absl::OkStatus();
}

}  // namespace hicache::comm
