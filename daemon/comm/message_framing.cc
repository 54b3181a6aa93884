#include "daemon/comm/message_framing.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/core/check.h"

namespace hicache::comm {
namespace {

void PutU32(char* out, uint32_t v) {
  out[0] = static_cast<char>(v & 0xff);
  out[1] = static_cast<char>((v >> 8) & 0xff);
  out[2] = static_cast<char>((v >> 16) & 0xff);
  out[3] = static_cast<char>((v >> 24) & 0xff);
}

uint32_t GetU32(const char* in) {
  const auto* u = reinterpret_cast<const unsigned char*>(in);
  return uint32_t{u[0]} | uint32_t{u[1]} << 8 | uint32_t{u[2]} << 16 |
         uint32_t{u[3]} << 24;
}

}  // namespace

MessagePacker::MessagePacker(size_t capacity) : capacity_(capacity) {
  HICACHE_CHECK(capacity >= 64 && capacity - kMessageHeaderBytes <
                                      size_t{kLastChunkBit},
                "message capacity out of range");
}

size_t MessagePacker::Pack(char* out) {
  HICACHE_CHECK(!pending_.empty(), "Pack with nothing to pack");
  size_t used = kMessageHeaderBytes;
  while (!pending_.empty() && capacity_ - used >= kChunkHeaderBytes) {
    const std::string& frame = pending_.front();
    const size_t rest = frame.size() - front_offset_;
    const size_t take =
        std::min(rest, capacity_ - used - kChunkHeaderBytes);
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
  if (available < kMessageHeaderBytes) {
    return absl::DataLossError(absl::StrCat(
        "malformed message: ", available, " bytes, shorter than its header"));
  }
  const size_t payload = GetU32(message);
  if (payload > available - kMessageHeaderBytes) {
    return absl::DataLossError(absl::StrCat(
        "malformed message: header claims ", payload, " bytes, at most ",
        available - kMessageHeaderBytes, " can have arrived"));
  }
  const char* p = message + kMessageHeaderBytes;
  const char* const end = p + payload;
  while (p < end) {
    if (static_cast<size_t>(end - p) < kChunkHeaderBytes) {
      return absl::DataLossError(absl::StrCat(
          "malformed message: ", end - p, " stray bytes after the last chunk"));
    }
    const uint32_t header = GetU32(p);
    p += kChunkHeaderBytes;
    const size_t len = header & ~kLastChunkBit;
    if (len > static_cast<size_t>(end - p)) {
      return absl::DataLossError(absl::StrCat(
          "malformed message: chunk of ", len, " bytes, only ", end - p,
          " left in the message"));
    }
    if (len > max_frame_bytes_ - partial_.size()) {
      return absl::DataLossError(absl::StrCat(
          "malformed message: frame grows past ", max_frame_bytes_,
          " bytes"));
    }
    partial_.append(p, len);
    p += len;
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
