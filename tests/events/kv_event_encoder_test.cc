// The encoder against msgspec: the golden bytes below are what vLLM 0.33.0's
// own classes (vllm/distributed/kv_events.py: KVEventBatch, BlockStored,
// BlockRemoved, AllBlocksCleared) encode with msgspec 0.23.0 for the same
// batch:
//
//   KVEventBatch(ts=1.5, data_parallel_rank=0, events=[
//     BlockStored(block_hashes=[15760518052499183552, 5],
//                 parent_block_hash=None, token_ids=[1, 200, 70000, 3],
//                 block_size=2, lora_id=None, medium="GPU", lora_name=None),
//     BlockStored(block_hashes=[7], parent_block_hash=5, token_ids=[9, 10],
//                 block_size=2, lora_id=None, medium="CPU", lora_name=None),
//     BlockRemoved(block_hashes=[15760518052499183552], medium="GPU"),
//     AllBlocksCleared()])
#include "daemon/events/kv_event_encoder.h"

#include <string>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "msgpack.hpp"

namespace hicache::events {
namespace {

constexpr char kGoldenHex[] =
    "93cb3ff800000000000094de0008a474797065ab426c6f636b53746f726564ac626c6f"
    "636b5f68617368657392cfdab89baa7b5857c005b1706172656e745f626c6f636b5f68"
    "617368c0a9746f6b656e5f6964739401ccc8ce0001117003aa626c6f636b5f73697a65"
    "02a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0de0008"
    "a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739107b17061"
    "72656e745f626c6f636b5f6861736805a9746f6b656e5f69647392090aaa626c6f636b"
    "5f73697a6502a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d"
    "65c083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391"
    "cfdab89baa7b5857c0a66d656469756da347505581a474797065b0416c6c426c6f636b"
    "73436c656172656400";

// The events' hashes and tokens (KvEvent holds views of them).
const std::vector<uint64_t> kHashes0 = {15760518052499183552ull, 5};
const std::vector<int32_t> kTokens0 = {1, 200, 70000, 3};
const std::vector<uint64_t> kHashes1 = {7};
const std::vector<int32_t> kTokens1 = {9, 10};
const std::vector<uint64_t> kHashes2 = {15760518052499183552ull};

std::vector<KvEvent> GoldenEvents() {
  std::vector<KvEvent> events(4);
  events[0].kind = KvEvent::Kind::kStored;
  events[0].tier = Tier::kDevice;
  events[0].block_hashes = kHashes0;
  events[0].token_ids = kTokens0;
  events[1].kind = KvEvent::Kind::kStored;
  events[1].tier = Tier::kHost;
  events[1].has_parent = true;
  events[1].parent_hash = 5;
  events[1].block_hashes = kHashes1;
  events[1].token_ids = kTokens1;
  events[2].kind = KvEvent::Kind::kRemoved;
  events[2].tier = Tier::kDevice;
  events[2].block_hashes = kHashes2;
  events[3].kind = KvEvent::Kind::kAllCleared;
  return events;
}

TEST(KvEventEncoderTest, MatchesMsgspecByteForByte) {
  const std::vector<KvEvent> events = GoldenEvents();
  std::vector<const KvEvent*> pointers;
  for (const KvEvent& e : events) pointers.push_back(&e);
  KvEventEncoder encoder({.block_size = 2});
  std::string out;
  encoder.EncodeBatch(1.5, pointers, &out);
  EXPECT_EQ(absl::BytesToHexString(out), kGoldenHex);
}

// Every integer width msgspec uses, for hashes and tokens (negative ones
// too): KVEventBatch(ts=3.25, data_parallel_rank=0, events=[BlockStored(
//   block_hashes=[0, 127, 128, 255, 256, 65535, 65536, 2**32-1, 2**32,
//                 2**64-1], parent_block_hash=2**32,
//   token_ids=[0, 127, 128, 255, 256, 65535, 65536, 2**31-1, -1, -33, -129,
//              -32769, -2**31], block_size=1, lora_id=None, medium="GPU",
//   lora_name=None)]).
TEST(KvEventEncoderTest, IntegersTakeMsgspecsWidths) {
  KvEvent e;
  e.kind = KvEvent::Kind::kStored;
  e.tier = Tier::kDevice;
  e.has_parent = true;
  e.parent_hash = uint64_t{1} << 32;
  const std::vector<uint64_t> hashes = {
      0,     127,   128,         255,
      256,   65535, 65536,       0xffffffffull,
      uint64_t{1} << 32, 0xffffffffffffffffull};
  const std::vector<int32_t> tokens = {0,          127,    128,    255,    256,
                                       65535,      65536,  INT32_MAX, -1,   -33,
                                       -129,       -32769, INT32_MIN};
  e.block_hashes = hashes;
  e.token_ids = tokens;
  std::vector<const KvEvent*> pointers = {&e};
  KvEventEncoder encoder({.block_size = 1});
  std::string out;
  encoder.EncodeBatch(3.25, pointers, &out);
  EXPECT_EQ(
      absl::BytesToHexString(out),
      "93cb400a00000000000091de0008a474797065ab426c6f636b53746f726564ac626c6f"
      "636b5f6861736865739a007fcc80ccffcd0100cdffffce00010000ceffffffffcf0000"
      "000100000000cfffffffffffffffffb1706172656e745f626c6f636b5f68617368cf00"
      "00000100000000a9746f6b656e5f6964739d007fcc80ccffcd0100cdffffce00010000"
      "ce7fffffffffd0dfd1ff7fd2ffff7fffd280000000aa626c6f636b5f73697a6501a76c"
      "6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c000");
}

TEST(KvEventEncoderTest, MediaAndRankAreConfigurable) {
  const std::vector<KvEvent> events = GoldenEvents();
  std::vector<const KvEvent*> pointers = {&events[1]};
  KvEventEncoder encoder({.block_size = 2,
                          .device_medium = "GPU",
                          .host_medium = "CPU_PINNED",
                          .data_parallel_rank = 3});
  std::string out;
  encoder.EncodeBatch(2.0, pointers, &out);
  msgpack::object_handle handle = msgpack::unpack(out.data(), out.size());
  const msgpack::object& batch = handle.get();
  ASSERT_EQ(batch.type, msgpack::type::ARRAY);
  ASSERT_EQ(batch.via.array.size, 3u);
  EXPECT_EQ(batch.via.array.ptr[0].type, msgpack::type::FLOAT64);
  EXPECT_EQ(batch.via.array.ptr[2].as<int>(), 3);
  const msgpack::object& event = batch.via.array.ptr[1].via.array.ptr[0];
  ASSERT_EQ(event.type, msgpack::type::MAP);
  bool saw_medium = false;
  for (uint32_t i = 0; i < event.via.map.size; ++i) {
    if (event.via.map.ptr[i].key.as<std::string>() == "medium") {
      EXPECT_EQ(event.via.map.ptr[i].val.as<std::string>(), "CPU_PINNED");
      saw_medium = true;
    }
  }
  EXPECT_TRUE(saw_medium);
}

TEST(KvEventEncoderTest, AnEmptyBatchIsStillThreeElements) {
  KvEventEncoder encoder({});
  std::string out;
  encoder.EncodeBatch(0.25, {}, &out);
  EXPECT_EQ(absl::BytesToHexString(out), "93cb3fd000000000000090" "00");
}

}  // namespace
}  // namespace hicache::events
