#pragma once

// Encodes KV events in vLLM's wire format: the msgpack that vLLM 0.33.0's
// msgspec classes (vllm/distributed/kv_events.py) produce, so a router
// decoding with them (msgspec.msgpack.Decoder(KVEventBatch)) reads ours.
//
//   KVEventBatch  an array (array_like=True): [ts, events, data_parallel_rank]
//                 (omit_defaults does not apply to array-like structs: all
//                 three elements are always there).
//   events        maps (tag=True, omit_defaults=True): "type" (the class
//                 name) first, then the fields in declaration order; fields
//                 with a default are left out at their default (None), fields
//                 without one are always written (nil for None).
//     BlockStored       type, block_hashes, parent_block_hash, token_ids,
//                       block_size, lora_id, medium, lora_name
//     BlockRemoved      type, block_hashes, medium
//     AllBlocksCleared  type
//   block hashes  msgpack unsigned integers (vLLM's int hashes, the default
//                 of VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES); ts a float64;
//                 integers in their smallest form, BlockStored's header a
//                 map16 (msgspec sizes it by the struct's 16 fields): the
//                 bytes are msgspec's, not only the structure
//                 (kv_event_encoder_test's golden batch).
//
// Thread-compatible; encoding allocates only the output.

#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "daemon/events/kv_event.h"

namespace hicache::events {

struct KvEventFormat {
  uint32_t block_size = 64;            // Tokens per block.
  std::string device_medium = "GPU";   // vLLM's MEDIUM_GPU.
  std::string host_medium = "CPU";     // vLLM's MEDIUM_CPU.
  int64_t data_parallel_rank = 0;
};

class KvEventEncoder {
 public:
  explicit KvEventEncoder(KvEventFormat format) : format_(std::move(format)) {}

  // One KVEventBatch of `events` (their topics are not encoded) stamped
  // `ts` (seconds since the Unix epoch), appended to *out.
  void EncodeBatch(double ts, absl::Span<const KvEvent* const> events,
                   std::string* out) const;

  const KvEventFormat& format() const { return format_; }

 private:
  KvEventFormat format_;
};

}  // namespace hicache::events
