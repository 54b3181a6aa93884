#include "daemon/events/kv_event_encoder.h"

#include <cstring>
#include <string_view>

#include "msgpack.hpp"

namespace hicache::events {
namespace {

// msgpack's output stream over a std::string, grown ahead and trimmed at
// the end: a write is a bounds check and a memcpy (std::string::append per
// token cost a third of the encoding).
class StringWriter {
 public:
  StringWriter(std::string* out, size_t expected) : out_(out), used_(out->size()) {
    out_->resize(used_ + expected);
  }
  ~StringWriter() { out_->resize(used_); }
  void write(const char* data, size_t size) {
    char* at = Reserve(size);
    std::memcpy(at, data, size);
  }
  // Room for `size` more bytes, taken (the caller fills them).
  char* Reserve(size_t size) {
    if (used_ + size > out_->size()) out_->resize(2 * (used_ + size));
    char* at = out_->data() + used_;
    used_ += size;
    return at;
  }
  // Gives back the last `size` bytes taken and not filled.
  void Unreserve(size_t size) { used_ -= size; }

 private:
  std::string* out_;
  size_t used_;
};

using Packer = msgpack::packer<StringWriter>;

void PackString(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

// Always a float64 (0xcb), as msgspec writes a float: msgpack-c's
// pack_double writes a whole number as an integer.
void PackFloat64(StringWriter& writer, double d) {
  uint64_t bits;
  static_assert(sizeof(bits) == sizeof(d));
  std::memcpy(&bits, &d, sizeof(d));
  char out[9];
  out[0] = '\xcb';
  for (int i = 0; i < 8; ++i) out[1 + i] = static_cast<char>(bits >> (56 - 8 * i));
  writer.write(out, sizeof(out));
}

// The hot loop of a batch (a token is about 5 bytes of it) written out:
// the bytes of packer::pack_uint64 (smallest form: positive fixint, uint8,
// uint16, uint32, uint64, big-endian), into room taken once per array (a
// negative token through the packer). kv_event_encoder_test compares every
// width with msgspec's bytes.
inline char* PutUnsigned(char* at, uint64_t v) {
  if (v < 128) {
    *at = static_cast<char>(v);
    return at + 1;
  }
  if (v < 256) {
    at[0] = '\xcc';
    at[1] = static_cast<char>(v);
    return at + 2;
  }
  if (v < 65536) {
    at[0] = '\xcd';
    at[1] = static_cast<char>(v >> 8);
    at[2] = static_cast<char>(v);
    return at + 3;
  }
  if (v <= 0xffffffffu) {
    at[0] = '\xce';
    at[1] = static_cast<char>(v >> 24);
    at[2] = static_cast<char>(v >> 16);
    at[3] = static_cast<char>(v >> 8);
    at[4] = static_cast<char>(v);
    return at + 5;
  }
  at[0] = '\xcf';
  for (int i = 0; i < 8; ++i) at[1 + i] = static_cast<char>(v >> (56 - 8 * i));
  return at + 9;
}

void PackHashes(Packer& pk, StringWriter& writer,
                absl::Span<const uint64_t> hashes) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  char* const begin = writer.Reserve(9 * hashes.size());
  char* at = begin;
  for (uint64_t hash : hashes) at = PutUnsigned(at, hash);
  writer.Unreserve(9 * hashes.size() - static_cast<size_t>(at - begin));
}

void PackTokens(Packer& pk, StringWriter& writer,
                absl::Span<const int32_t> tokens) {
  pk.pack_array(static_cast<uint32_t>(tokens.size()));
  size_t i = 0;
  while (i < tokens.size()) {
    // A run of non-negative tokens in one reservation.
    size_t end = i;
    while (end < tokens.size() && tokens[end] >= 0) ++end;
    if (end > i) {
      char* const begin = writer.Reserve(5 * (end - i));
      char* at = begin;
      for (size_t k = i; k < end; ++k) {
        at = PutUnsigned(at, static_cast<uint64_t>(tokens[k]));
      }
      writer.Unreserve(5 * (end - i) - static_cast<size_t>(at - begin));
      i = end;
    } else {
      pk.pack_int32(tokens[i++]);
    }
  }
}

}  // namespace

void KvEventEncoder::EncodeBatch(double ts,
                                 absl::Span<const KvEvent* const> events,
                                 std::string* out) const {
  size_t expected = 32;
  for (const KvEvent* event : events) {
    // At most 9 bytes a hash and 5 a token: never grown while encoding.
    expected += 160 + 9 * event->block_hashes.size() +
                5 * event->token_ids.size();
  }
  StringWriter writer(out, expected);
  Packer pk(writer);
  pk.pack_array(3);
  PackFloat64(writer, ts);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvEvent* event : events) {
    const std::string& medium = event->tier == Tier::kDevice
                                    ? format_.device_medium
                                    : format_.host_medium;
    switch (event->kind) {
      case KvEvent::Kind::kStored: {
        // msgspec sizes a struct's map header by its field count (16 with
        // the tag, past fixmap's 15): a map16 of 8 entries, byte for byte.
        static constexpr char kMap16Of8[] = {'\xde', '\x00', '\x08'};
        writer.write(kMap16Of8, sizeof(kMap16Of8));
        PackString(pk, "type");
        PackString(pk, "BlockStored");
        PackString(pk, "block_hashes");
        PackHashes(pk, writer, event->block_hashes);
        PackString(pk, "parent_block_hash");
        if (event->has_parent) {
          pk.pack_uint64(event->parent_hash);
        } else {
          pk.pack_nil();
        }
        PackString(pk, "token_ids");
        PackTokens(pk, writer, event->token_ids);
        PackString(pk, "block_size");
        pk.pack_uint32(format_.block_size);
        PackString(pk, "lora_id");
        pk.pack_nil();
        PackString(pk, "medium");
        PackString(pk, medium);
        PackString(pk, "lora_name");
        pk.pack_nil();
        break;
      }
      case KvEvent::Kind::kRemoved:
        pk.pack_map(3);
        PackString(pk, "type");
        PackString(pk, "BlockRemoved");
        PackString(pk, "block_hashes");
        PackHashes(pk, writer, event->block_hashes);
        PackString(pk, "medium");
        PackString(pk, medium);
        break;
      case KvEvent::Kind::kAllCleared:
        pk.pack_map(1);
        PackString(pk, "type");
        PackString(pk, "AllBlocksCleared");
        break;
    }
  }
  pk.pack_int64(format_.data_parallel_rank);
}

}  // namespace hicache::events
