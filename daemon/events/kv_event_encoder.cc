#include "daemon/events/kv_event_encoder.h"

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
  pk.pack_double(ts);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvEvent* event : events) {
    const std::string& medium = event->tier == Tier::kDevice
                                    ? format_.device_medium
                                    : format_.host_medium;
    switch (event->kind) {
      case KvEvent::Kind::kStored:
        pk.pack_map(8);
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
