#include "daemon/events/kv_event_encoder.h"

#include <cstring>
#include <string_view>

#include "msgpack.hpp"

namespace hicache::events {
namespace {

// A std::string as msgpack's output buffer (no intermediate copy).
class StringWriter {
 public:
  explicit StringWriter(std::string* out) : out_(out) {}
  void write(const char* data, size_t size) { out_->append(data, size); }

 private:
  std::string* out_;
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

void PackHashes(Packer& pk, const std::vector<uint64_t>& hashes) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (uint64_t hash : hashes) pk.pack_uint64(hash);
}

}  // namespace

void KvEventEncoder::EncodeBatch(double ts,
                                 absl::Span<const KvEvent* const> events,
                                 std::string* out) const {
  StringWriter writer(out);
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
        PackHashes(pk, event->block_hashes);
        PackString(pk, "parent_block_hash");
        if (event->has_parent) {
          pk.pack_uint64(event->parent_hash);
        } else {
          pk.pack_nil();
        }
        PackString(pk, "token_ids");
        pk.pack_array(static_cast<uint32_t>(event->token_ids.size()));
        for (int32_t token : event->token_ids) pk.pack_int32(token);
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
        PackHashes(pk, event->block_hashes);
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
