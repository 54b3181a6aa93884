#include "daemon/group/group_wire.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace hicache::group {
namespace {

constexpr auto kD2H = TransferDirection::kDeviceToHost;
constexpr auto kH2D = TransferDirection::kHostToDevice;

TransferTask SampleTask(uint64_t op, uint32_t step, int pages) {
  TransferTask task{.op_id = op, .direction = kD2H, .step = step};
  for (Rank rank : {Rank{0}, Rank{1}}) {
    RankCopy copy{.rank = rank};
    for (int i = 0; i < pages; ++i) {
      copy.device_pages.push_back(100 + i);
      copy.host_pages.push_back(7 + 3 * i);
    }
    task.ranks.push_back(std::move(copy));
  }
  return task;
}

Frame RoundTrip(const Frame& frame) {
  const std::string bytes = EncodeFrame(frame);
  absl::StatusOr<Frame> decoded = DecodeFrame(bytes);
  EXPECT_TRUE(decoded.ok()) << decoded.status();
  if (!decoded.ok()) return Frame{};
  EXPECT_TRUE(SameFrame(frame, *decoded));
  // Canonical: what decodes re-encodes to the same bytes.
  EXPECT_EQ(EncodeFrame(*decoded), bytes);
  return *decoded;
}

std::vector<Frame> SampleFrames() {
  std::vector<Frame> frames;
  auto add = [&](FrameBody body) {
    const FrameKind kind = KindOf(body);
    frames.push_back(Frame{{kWireVersion, kind, 3, frames.size() + 1},
                           std::move(body)});
  };
  add(Hello{.sender_time_ns = 1234567890123, .member_index = 2});
  add(Heartbeat{.sender_time_ns = -5, .member_index = 0});
  TaskBatch tasks;
  tasks.tasks.push_back(SampleTask(9, 0, 3));
  TransferTask odd{.op_id = std::numeric_limits<uint64_t>::max(),
                   .direction = kH2D,
                   .step = 4000000000u};
  // Shapes the receiver refuses still travel: mismatched lists, negative and
  // extreme pages, a fence.
  odd.ranks.push_back(RankCopy{
      .rank = 0xffffffffu,
      .device_pages = {std::numeric_limits<int64_t>::min(), -1, 0,
                       std::numeric_limits<int64_t>::max()},
      .host_pages = {5},
      .wait_fence = 77});
  odd.ranks.push_back(RankCopy{.rank = 3});
  tasks.tasks.push_back(odd);
  tasks.tasks.push_back(TransferTask{.op_id = 1});
  add(tasks);
  add(TaskBatch{});
  StepDoneBatch dones;
  dones.dones.push_back(StepDone{.op_id = 9,
                                 .direction = kD2H,
                                 .rank = 1,
                                 .step = 2,
                                 .status = absl::OkStatus(),
                                 .bytes = 4096});
  dones.dones.push_back(StepDone{.op_id = 10,
                                 .direction = kH2D,
                                 .rank = 0,
                                 .step = 0,
                                 .status = absl::UnavailableError("gone"),
                                 .bytes = 0,
                                 .fence = std::string("\0\1\2", 3)});
  dones.dones.push_back(StepDone{.status = absl::InternalError("")});
  add(dones);
  add(Bye{.reason = "shutting down"});
  add(Bye{});
  // Kinds 6-8: worker events and acks across the link.
  WorkerEventBatch events;
  events.events.push_back(WorkerEventRecord{.op = 5,
                                            .kind = WorkerEventKind::kBackupStep,
                                            .rank = 1,
                                            .step = 3,
                                            .ns = "tenant-a"});
  events.events.push_back(WorkerEventRecord{
      .op = std::numeric_limits<uint64_t>::max(),
      .kind = WorkerEventKind::kLoadStep,
      .rank = 0xffffffffu,
      .step = 4000000000u,
      .fence = std::string("\0\xff\1", 3),
      .ns = ""});
  events.events.push_back(WorkerEventRecord{
      .op = 6, .kind = WorkerEventKind::kLoadDone, .ok = false, .ns = "n"});
  events.events.push_back(
      WorkerEventRecord{.op = 7, .kind = WorkerEventKind::kCommitted});
  events.events.push_back(
      WorkerEventRecord{.op = 8, .kind = WorkerEventKind::kRolledBack});
  add(events);
  add(WorkerEventBatch{});
  add(LayerStoredRequest{
      .request_id = 11, .ns = "tenant-a", .rank = 2, .step = 7, .ops = {1, 2}});
  add(LayerStoredRequest{});
  add(LayerStoredAck{.request_id = 11});
  add(LayerStoredAck{.request_id = 12,
                     .status = absl::PermissionDeniedError("not yours")});
  return frames;
}

TEST(GroupWireTest, EveryKindRoundTrips) {
  for (const Frame& frame : SampleFrames()) RoundTrip(frame);
}

TEST(GroupWireTest, HeaderDecodesAlone) {
  const std::string bytes =
      EncodeFrame(42, 7, Heartbeat{.sender_time_ns = 1, .member_index = 1});
  absl::StatusOr<FrameHeader> header = DecodeFrameHeader(bytes);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->kind, FrameKind::kHeartbeat);
  EXPECT_EQ(header->epoch, 42u);
  EXPECT_EQ(header->seq, 7u);
}

// The layout docs/cp-groups.md and group_wire.h document, byte for byte.
TEST(GroupWireTest, TasksFrameLayoutIsAsDocumented) {
  TaskBatch batch;
  batch.tasks.push_back(TransferTask{
      .op_id = 0x0102030405060708ull,
      .direction = kH2D,
      .step = 5,
      .ranks = {RankCopy{.rank = 2,
                         .device_pages = {3, 4, 2},
                         .host_pages = {200},
                         .wait_fence = 0x99}}});
  const std::string bytes = EncodeFrame(0x11, 0x22, batch);
  const std::vector<uint8_t> expected = {
      1, 3,                                            // version, kind tasks
      0x11, 0, 0, 0, 0, 0, 0, 0,                       // epoch
      0x22, 0, 0, 0, 0, 0, 0, 0,                       // seq
      1, 0, 0, 0,                                      // one task
      8, 7, 6, 5, 4, 3, 2, 1,                          // op_id
      1,                                               // host -> device
      5, 0, 0, 0,                                      // step
      1, 0, 0, 0,                                      // one rank copy
      2, 0, 0, 0,                                      // rank
      0x99, 0, 0, 0, 0, 0, 0, 0,                       // wait_fence
      3, 0, 0, 0, 6, 2, 3,                             // device: +3 +1 -2
      1, 0, 0, 0, 0x90, 0x03,                          // host: +200
  };
  ASSERT_EQ(bytes.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(static_cast<uint8_t>(bytes[i]), expected[i]) << "byte " << i;
  }
  EXPECT_EQ(bytes.size(),
            kFrameHeaderBytes + 4 + EncodedTaskBytes(batch.tasks[0]));
  RoundTrip(Frame{{kWireVersion, FrameKind::kTasks, 0x11, 0x22}, batch});
}

TEST(GroupWireTest, StepDonesAndHelloLayoutIsAsDocumented) {
  const std::string hello =
      EncodeFrame(1, 1, Hello{.sender_time_ns = 0x0a0b, .member_index = 3});
  EXPECT_EQ(hello, std::string("\x01\x01"
                               "\x01\0\0\0\0\0\0\0"
                               "\x01\0\0\0\0\0\0\0"
                               "\x0b\x0a\0\0\0\0\0\0"
                               "\x03\0\0\0",
                               30));
  StepDoneBatch batch;
  batch.dones.push_back(StepDone{.op_id = 1,
                                 .direction = kD2H,
                                 .rank = 2,
                                 .step = 3,
                                 .status = absl::NotFoundError("x"),
                                 .bytes = 4,
                                 .fence = "f"});
  const std::string dones = EncodeFrame(0, 0, batch);
  const std::string body = dones.substr(kFrameHeaderBytes);
  EXPECT_EQ(body, std::string("\x01\0\0\0"            // one
                              "\x01\0\0\0\0\0\0\0"    // op
                              "\x00"                  // d2h
                              "\x02\0\0\0"            // rank
                              "\x03\0\0\0"            // step
                              "\x05"                  // NOT_FOUND
                              "\x01\0\0\0x"           // message
                              "\x04\0\0\0\0\0\0\0"    // bytes
                              "\x01\0\0\0f",          // fence
                              4 + 8 + 1 + 4 + 4 + 1 + 5 + 8 + 5));
  EXPECT_EQ(dones.size(),
            kFrameHeaderBytes + 4 + EncodedStepDoneBytes(batch.dones[0]));
}

TEST(GroupWireTest, EveryTruncationIsRefused) {
  for (const Frame& frame : SampleFrames()) {
    const std::string bytes = EncodeFrame(frame);
    for (size_t n = 0; n < bytes.size(); ++n) {
      absl::StatusOr<Frame> decoded = DecodeFrame(bytes.substr(0, n));
      // A few prefixes are themselves complete frames (an empty batch); all
      // others must be refused as DATA_LOSS.
      if (decoded.ok()) {
        EXPECT_EQ(EncodeFrame(*decoded), bytes.substr(0, n));
        continue;
      }
      EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss)
          << n << ": " << decoded.status();
    }
    // And a byte too many.
    absl::StatusOr<Frame> longer = DecodeFrame(bytes + std::string(1, '\0'));
    ASSERT_FALSE(longer.ok());
    EXPECT_EQ(longer.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(longer.status().message().find("trailing"), std::string::npos)
        << longer.status();
  }
}

TEST(GroupWireTest, UnknownVersionAndKindAreRefused) {
  std::string bytes = EncodeFrame(1, 1, Bye{"x"});
  std::string v2 = bytes;
  v2[0] = 2;
  absl::StatusOr<Frame> decoded = DecodeFrame(v2);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("version 2"), std::string::npos);
  for (uint8_t kind : {0, 100, 255}) {
    std::string k = bytes;
    k[1] = static_cast<char>(kind);
    decoded = DecodeFrame(k);
    ASSERT_FALSE(decoded.ok());
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(decoded.status().message().find("kind"), std::string::npos);
  }
}

std::string Header(FrameKind kind) {
  std::string h = EncodeFrame(0, 0, Bye{}).substr(0, kFrameHeaderBytes);
  h[1] = static_cast<char>(kind);
  return h;
}

std::string U32(uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}

void ExpectDataLoss(const std::string& bytes, const std::string& words) {
  absl::StatusOr<Frame> decoded = DecodeFrame(bytes);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(decoded.status().message().find(words), std::string::npos)
      << decoded.status();
}

TEST(GroupWireTest, HostileCountsAreRefusedBeforeAllocating) {
  ExpectDataLoss(Header(FrameKind::kTasks) + U32(0xffffffffu), "task count");
  ExpectDataLoss(Header(FrameKind::kStepDones) + U32(0x10000000u),
                 "step_done count");
  // One task whose rank count is huge.
  std::string task = U32(1) + std::string(8, '\0') + std::string(1, '\0') +
                     U32(0) + U32(0x7fffffffu);
  ExpectDataLoss(Header(FrameKind::kTasks) + task, "task rank count");
  // One rank copy whose page count is huge.
  std::string copy = U32(1) + std::string(8, '\0') + std::string(1, '\0') +
                     U32(0) + U32(1) + U32(0) + std::string(8, '\0') +
                     U32(0xfffffff0u) + std::string(8, '\0');
  ExpectDataLoss(Header(FrameKind::kTasks) + copy, "device pages");
  // A string longer than the frame.
  ExpectDataLoss(Header(FrameKind::kBye) + U32(1000) + "abc", "bye reason");
}

TEST(GroupWireTest, NonCanonicalFieldsAreRefused) {
  auto one_page = [](std::string varint) {
    return Header(FrameKind::kTasks) + U32(1) + std::string(8, '\0') +
           std::string(1, '\0') + U32(0) + U32(1) + U32(0) +
           std::string(8, '\0') + U32(1) + varint + U32(0);
  };
  EXPECT_TRUE(DecodeFrame(one_page("\x02")).ok());
  ExpectDataLoss(one_page(std::string("\x82\x00", 2)), "not minimal");
  ExpectDataLoss(one_page(std::string(9, '\xff') + "\x02"), "overflows");
  ExpectDataLoss(one_page(std::string(10, '\xff')), "overflows");
  // Direction 2.
  ExpectDataLoss(Header(FrameKind::kTasks) + U32(1) + std::string(8, '\0') +
                     std::string(1, '\x02') + U32(0) + U32(0),
                 "direction");
  // Status code 17, and an OK status with a message.
  auto done = [](uint8_t code, std::string message) {
    return Header(FrameKind::kStepDones) + U32(1) + std::string(8, '\0') +
           std::string(1, '\0') + U32(0) + U32(0) +
           std::string(1, static_cast<char>(code)) + U32(message.size()) +
           message + std::string(8, '\0') + U32(0);
  };
  EXPECT_TRUE(DecodeFrame(done(14, "m")).ok());
  ExpectDataLoss(done(17, ""), "status code 17");
  ExpectDataLoss(done(0, "m"), "OK status carries a message");
}

TEST(GroupWireTest, TypicalStepSizes) {
  // 64 pages on each of 2 ranks; consecutive pages cost one byte each.
  TaskBatch batch;
  batch.tasks.push_back(SampleTask(1, 0, 64));
  const std::string consecutive = EncodeFrame(1, 1, batch);
  // Device pages 100, 101, ... (the first delta takes 2 bytes, then 1 each),
  // host pages 7, 10, ... (1 byte each).
  EXPECT_EQ(consecutive.size(), kFrameHeaderBytes + 4 + kTaskFixedBytes +
                                    2 * (4 + 8 + 4 + 65 + 4 + 64));
  // Scattered pages in a 1M-page pool: at most 3 bytes each (|delta| < 2^20).
  for (RankCopy& copy : batch.tasks[0].ranks) {
    for (size_t i = 0; i < copy.device_pages.size(); ++i) {
      copy.device_pages[i] = (i * 7919 * 131) % (1 << 20);
      copy.host_pages[i] = (i * 104729) % (1 << 20);
    }
  }
  const std::string scattered = EncodeFrame(1, 1, batch);
  EXPECT_LE(scattered.size(), kFrameHeaderBytes + 4 + kTaskFixedBytes +
                                  2 * (4 + 8 + 4 + 3 * 64 + 4 + 3 * 64));
  RecordProperty("tasks_frame_bytes_64_pages_2_ranks_consecutive",
                 static_cast<int>(consecutive.size()));
  RecordProperty("tasks_frame_bytes_64_pages_2_ranks_scattered",
                 static_cast<int>(scattered.size()));
  std::printf("Tasks frame, 64 pages on 2 ranks: %zu bytes consecutive, %zu "
              "scattered\n",
              consecutive.size(), scattered.size());
}

// ---- Kinds 6-8: worker events and acks across the link ----

std::string U64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}
std::string Str(const std::string& v) { return U32(v.size()) + v; }
std::string Byte(uint8_t v) { return std::string(1, static_cast<char>(v)); }

TEST(GroupWireTest, WorkerEventsLayoutIsAsDocumented) {
  WorkerEventBatch batch;
  batch.events.push_back(WorkerEventRecord{.op = 0x0102,
                                           .kind = WorkerEventKind::kLoadStep,
                                           .rank = 3,
                                           .step = 4,
                                           .ok = true,
                                           .fence = "fe",
                                           .ns = "ns"});
  const std::string bytes = EncodeFrame(9, 2, batch);
  EXPECT_EQ(static_cast<uint8_t>(bytes[1]), 6);
  EXPECT_EQ(bytes.substr(kFrameHeaderBytes),
            U32(1) + U64(0x0102) + Byte(3) + U32(3) + U32(4) + Byte(1) +
                Str("fe") + Str("ns"));
  EXPECT_EQ(bytes.size(),
            kFrameHeaderBytes + 4 + EncodedWorkerEventBytes(batch.events[0]));
  const std::string stored = EncodeFrame(
      1, 1, LayerStoredRequest{.request_id = 5, .ns = "a", .rank = 1,
                               .step = 2, .ops = {9}});
  EXPECT_EQ(static_cast<uint8_t>(stored[1]), 7);
  EXPECT_EQ(stored.substr(kFrameHeaderBytes),
            U64(5) + Str("a") + U32(1) + U32(2) + U32(1) + U64(9));
  const std::string ack = EncodeFrame(
      1, 1, LayerStoredAck{.request_id = 5,
                           .status = absl::InvalidArgumentError("no")});
  EXPECT_EQ(static_cast<uint8_t>(ack[1]), 8);
  EXPECT_EQ(ack.substr(kFrameHeaderBytes), U64(5) + Byte(3) + Str("no"));
  EXPECT_EQ(FrameKindName(6), "worker_events");
  EXPECT_EQ(FrameKindName(7), "layer_stored");
  EXPECT_EQ(FrameKindName(8), "layer_stored_ack");
}

TEST(GroupWireTest, MalformedWorkerEventsAndAcksAreRefused) {
  auto event = [](uint8_t kind, uint8_t ok, std::string fence_len) {
    return Header(FrameKind::kWorkerEvents) + U32(1) + U64(1) + Byte(kind) +
           U32(0) + U32(0) + Byte(ok) + fence_len + U32(0);
  };
  EXPECT_TRUE(DecodeFrame(event(4, 1, U32(0))).ok());
  ExpectDataLoss(event(5, 1, U32(0)), "worker_event kind 5");
  ExpectDataLoss(event(0, 2, U32(0)), "worker_event ok 2");
  ExpectDataLoss(event(0, 1, U32(1000)), "worker_event fence");
  // Namespace length past the end.
  ExpectDataLoss(Header(FrameKind::kWorkerEvents) + U32(1) + U64(1) + Byte(0) +
                     U32(0) + U32(0) + Byte(1) + U32(0) + U32(0x7fffffffu),
                 "worker_event namespace");
  // Hostile counts, refused before allocating.
  ExpectDataLoss(Header(FrameKind::kWorkerEvents) + U32(0xffffffffu),
                 "worker_event count");
  ExpectDataLoss(Header(FrameKind::kLayerStored) + U64(1) + Str("n") + U32(0) +
                     U32(0) + U32(0x40000000u) + U64(1),
                 "layer_stored op count");
  ExpectDataLoss(Header(FrameKind::kLayerStored) + U64(1) + U32(1000) + "n",
                 "layer_stored namespace");
  // Ack: status code 17, an OK status with a message, truncation.
  auto ack = [](uint8_t code, std::string message) {
    return Header(FrameKind::kLayerStoredAck) + U64(1) + Byte(code) +
           Str(message);
  };
  EXPECT_TRUE(DecodeFrame(ack(7, "denied")).ok());
  ExpectDataLoss(ack(17, ""), "layer_stored_ack status code 17");
  ExpectDataLoss(ack(0, "m"), "OK status carries a message");
  ExpectDataLoss(Header(FrameKind::kLayerStoredAck) + U64(1),
                 "layer_stored_ack status code: truncated");
  // Trailing bytes after an ack.
  ExpectDataLoss(ack(0, "") + "x", "trailing");
}

// The bytes of every kind, pinned: computed with the hand-written encoder
// that preceded le_bytes, so a codec change that moves a byte fails here
// (hex, header first: version, kind, epoch, seq).
TEST(GroupWireTest, FrameBytesArePinned) {
  constexpr uint64_t kEpoch = 0x1122334455667788ull;
  auto hex = [&](uint64_t seq, const FrameBody& body) {
    const std::string bytes = EncodeFrame(kEpoch, seq, body);
    absl::StatusOr<Frame> decoded = DecodeFrame(bytes);
    EXPECT_TRUE(decoded.ok()) << decoded.status();
    if (decoded.ok()) EXPECT_EQ(EncodeFrame(*decoded), bytes);
    return absl::BytesToHexString(bytes);
  };
  EXPECT_EQ(hex(42, Hello{.sender_time_ns = 1234567890123, .member_index = 2}),
            "010188776655443322112a00000000000000cb04fb711f01000002000000");
  EXPECT_EQ(hex(43, Heartbeat{.sender_time_ns = -5, .member_index = 7}),
            "010288776655443322112b00000000000000fbffffffffffffff07000000");
  TaskBatch tasks;
  TransferTask task{.op_id = 9, .direction = kH2D, .step = 3};
  task.ranks.push_back(RankCopy{.rank = 1,
                                .device_pages = {100, 101, 5, 1 << 20},
                                .host_pages = {7, -3, 1000000},
                                .wait_fence = 77});
  task.ranks.push_back(
      RankCopy{.rank = 0xffffffffu,
               .device_pages = {std::numeric_limits<int64_t>::min(), -1, 0,
                                std::numeric_limits<int64_t>::max()},
               .host_pages = {5}});
  tasks.tasks.push_back(task);
  tasks.tasks.push_back(TransferTask{.op_id = 1});
  EXPECT_EQ(hex(44, tasks),
            "010388776655443322112c000000000000000200000009000000000000000103"
            "00000002000000010000004d0000000000000004000000c80102bf01f6ff7f03"
            "0000000e1386897affffffff000000000000000004000000ffffffffffffffff"
            "ff01feffffffffffffffff0102feffffffffffffffff01010000000a01000000"
            "00000000000000000000000000");
  StepDoneBatch dones;
  dones.dones.push_back(StepDone{.op_id = 9,
                                 .rank = 1,
                                 .step = 2,
                                 .status = absl::OkStatus(),
                                 .bytes = 4096});
  dones.dones.push_back(StepDone{.op_id = 10,
                                 .direction = kH2D,
                                 .status = absl::UnavailableError("gone"),
                                 .fence = std::string("\0\1\2", 3)});
  EXPECT_EQ(hex(45, dones),
            "010488776655443322112d000000000000000200000009000000000000000001"
            "0000000200000000000000000010000000000000000000000a00000000000000"
            "0100000000000000000e04000000676f6e650000000000000000030000000001"
            "02");
  EXPECT_EQ(hex(46, Bye{.reason = "bye now"}),
            "010588776655443322112e0000000000000007000000627965206e6f77");
  const std::vector<RankTally> ranks = {RankTally{.rank = 3,
                                                  .device_pages_per_rank = 10,
                                                  .host_pages_per_rank = 20,
                                                  .copies_d2h = 1,
                                                  .copies_h2d = 2,
                                                  .pages_d2h = 3,
                                                  .pages_h2d = 4,
                                                  .refused = 5,
                                                  .hash = ~uint64_t{0}}};
  EXPECT_EQ(
      hex(50, Digest{.tasks_frames = 0x0102030405060708ull, .ranks = ranks}),
      "0109887766554433221132000000000000000807060504030201010000000300"
      "00000a0000000000000014000000000000000100000000000000020000000000"
      "0000030000000000000004000000000000000500000000000000ffffffffffff"
      "ffff");
  EXPECT_EQ(
      hex(51, DigestResult{.tasks_frames = 77, .match = true, .ranks = ranks}),
      "010a887766554433221133000000000000004d00000000000000010100000003"
      "0000000a00000000000000140000000000000001000000000000000200000000"
      "000000030000000000000004000000000000000500000000000000ffffffffff"
      "ffffff");
}

TEST(GroupWireTest, AckStatusOutsideAbslIsSentAsUnknown) {
  const std::string bytes = EncodeFrame(
      1, 1, LayerStoredAck{.request_id = 3,
                           .status = absl::Status(
                               static_cast<absl::StatusCode>(99), "odd")});
  absl::StatusOr<Frame> decoded = DecodeFrame(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const auto& got = std::get<LayerStoredAck>(decoded->body);
  EXPECT_EQ(got.status.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(got.status.message(), "odd");
}

}  // namespace
}  // namespace hicache::group
