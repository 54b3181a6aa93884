#include "daemon/comm/message_framing.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"

namespace hicache::comm {
namespace {

constexpr size_t kCapacity = 256;

void PutU32(char* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// Packs everything pushed, feeds each message to an assembler, returns the
// frames and the number of messages.
std::vector<std::string> RoundTrip(const std::vector<std::string>& in,
                                   int* messages) {
  MessagePacker packer(kCapacity);
  for (const auto& f : in) packer.Push(f);
  FrameAssembler assembler;
  std::vector<std::string> out;
  std::vector<char> buf(kCapacity, '\xee');
  *messages = 0;
  while (!packer.empty()) {
    const size_t n = packer.Pack(buf.data());
    EXPECT_LE(n, kCapacity);
    ++*messages;
    const absl::Status s = assembler.Consume(buf.data(), buf.size(), &out);
    EXPECT_TRUE(s.ok()) << s;
  }
  EXPECT_FALSE(assembler.mid_frame());
  return out;
}

TEST(MessageFramingTest, SmallFramesShareOneMessage) {
  int messages = 0;
  const std::vector<std::string> in = {"a", "", "bc", std::string(100, 'x')};
  EXPECT_EQ(RoundTrip(in, &messages), in);
  EXPECT_EQ(messages, 1);
}

// The bytes of packed messages, pinned: computed with the hand-written
// encoder that preceded le_bytes, so a codec change that moves a byte fails
// here. Headers: u32 payload bytes; u32 chunk bytes | bit 31 on a frame's
// last chunk.
TEST(MessageFramingTest, MessageBytesArePinned) {
  constexpr size_t kSmall = 64;
  MessagePacker packer(kSmall);
  for (std::string f : {std::string(), std::string("hello"),
                        std::string(150, 'z'), std::string("x")}) {
    packer.Push(std::move(f));
  }
  auto hex = [](absl::string_view h) {
    return absl::HexStringToBytes(absl::StrReplaceAll(h, {{"_", ""}}));
  };
  const std::vector<std::string> want = {
      hex("3c000000_00000080_05000080") + "hello" + hex("2b000000") +
          std::string(43, 'z'),
      hex("3c000000_38000000") + std::string(56, 'z'),
      hex("3c000000_33000080") + std::string(51, 'z') + hex("01000080") + "x"};
  std::vector<std::string> frames;
  FrameAssembler assembler;
  for (const std::string& message : want) {
    ASSERT_FALSE(packer.empty());
    std::string buf(kSmall, '\xee');
    EXPECT_EQ(packer.Pack(buf.data()), kSmall);
    EXPECT_EQ(buf, message);
    ASSERT_TRUE(
        assembler.Consume(message.data(), message.size(), &frames).ok());
  }
  EXPECT_TRUE(packer.empty());
  EXPECT_EQ(frames, (std::vector<std::string>{"", "hello",
                                              std::string(150, 'z'), "x"}));
}

TEST(MessageFramingTest, LargeFramesAreFragmentedAndReassembled) {
  std::vector<std::string> in;
  for (int i = 0; i < 50; ++i) {
    std::string f(static_cast<size_t>(i * 61 % 1000), '\0');
    for (size_t j = 0; j < f.size(); ++j) f[j] = static_cast<char>(i + j);
    in.push_back(f);
  }
  in.push_back(std::string(10 * kCapacity, 'z'));
  in.push_back("");
  int messages = 0;
  EXPECT_EQ(RoundTrip(in, &messages), in);
  EXPECT_GT(messages, 10);
}

TEST(MessageFramingTest, ExactFitAndHeaderOnlyRoom) {
  // A frame that leaves exactly a chunk header's room, then frames of every
  // size around the boundary.
  for (size_t first = 230; first < kCapacity; ++first) {
    const std::vector<std::string> in = {std::string(first, 'a'), "",
                                         std::string(7, 'b')};
    int messages = 0;
    ASSERT_EQ(RoundTrip(in, &messages), in) << first;
  }
}

TEST(MessageFramingTest, HeaderLongerThanTheBufferIsDataLoss) {
  std::vector<char> buf(kCapacity, 0);
  PutU32(buf.data(), kCapacity - 3);  // One byte more than can be there.
  FrameAssembler a;
  std::vector<std::string> out;
  EXPECT_EQ(a.Consume(buf.data(), buf.size(), &out).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(a.Consume(buf.data(), 3, &out).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_TRUE(out.empty());
}

TEST(MessageFramingTest, ChunkPastTheMessageIsDataLoss) {
  std::vector<char> buf(kCapacity, 0);
  PutU32(buf.data(), 4 + 10);
  PutU32(buf.data() + 4, 11 | kLastChunkBit);  // 11 > 10 bytes left.
  FrameAssembler a;
  std::vector<std::string> out;
  EXPECT_EQ(a.Consume(buf.data(), buf.size(), &out).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_TRUE(out.empty());
}

TEST(MessageFramingTest, StrayBytesAfterTheLastChunkAreDataLoss) {
  std::vector<char> buf(kCapacity, 0);
  PutU32(buf.data(), 4 + 2 + 3);
  PutU32(buf.data() + 4, 2 | kLastChunkBit);
  FrameAssembler a;
  std::vector<std::string> out;
  EXPECT_EQ(a.Consume(buf.data(), buf.size(), &out).code(),
            absl::StatusCode::kDataLoss);
}

TEST(MessageFramingTest, FrameGrowingPastTheLimitIsDataLoss) {
  FrameAssembler a(/*max_frame_bytes=*/100);
  std::vector<char> buf(kCapacity, 0);
  PutU32(buf.data(), 4 + 60);
  PutU32(buf.data() + 4, 60);  // Not last.
  std::vector<std::string> out;
  ASSERT_TRUE(a.Consume(buf.data(), buf.size(), &out).ok());
  EXPECT_TRUE(a.mid_frame());
  EXPECT_EQ(a.Consume(buf.data(), buf.size(), &out).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_TRUE(out.empty());
}

TEST(MessageFramingTest, EmptyMessageIsANoOp) {
  std::vector<char> buf(kCapacity, '\x55');
  PutU32(buf.data(), 0);
  FrameAssembler a;
  std::vector<std::string> out;
  EXPECT_TRUE(a.Consume(buf.data(), buf.size(), &out).ok());
  EXPECT_TRUE(out.empty());
}

// Every possible corruption of one byte of a valid message either parses or
// is DATA_LOSS; none reads past the buffer (ASan) or crashes.
TEST(MessageFramingTest, SingleByteCorruptionsNeverCrash) {
  MessagePacker packer(kCapacity);
  packer.Push("hello");
  packer.Push(std::string(300, 'q'));
  std::vector<char> good(kCapacity, 0);
  packer.Pack(good.data());
  for (size_t pos = 0; pos < 16; ++pos) {
    for (int v = 0; v < 256; ++v) {
      std::vector<char> bad = good;
      bad[pos] = static_cast<char>(v);
      FrameAssembler a;
      std::vector<std::string> out;
      const absl::Status s = a.Consume(bad.data(), bad.size(), &out);
      ASSERT_TRUE(s.ok() || s.code() == absl::StatusCode::kDataLoss) << s;
    }
  }
}

}  // namespace
}  // namespace hicache::comm
