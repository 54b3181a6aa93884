#include "daemon/core/le_bytes.h"

#include <string>

#include "gtest/gtest.h"

namespace hicache {
namespace {

TEST(LeBytesTest, WritesLeastSignificantByteFirst) {
  std::string out;
  LeWriter w(&out);
  w.U8(0xab);
  w.U32(0x01020304);
  w.U64(0x1122334455667788ULL);
  w.I64(-2);
  w.Bytes("xy");
  w.Zeros(2);
  EXPECT_EQ(out, std::string("\xab\x04\x03\x02\x01"
                             "\x88\x77\x66\x55\x44\x33\x22\x11"
                             "\xfe\xff\xff\xff\xff\xff\xff\xff"
                             "xy\0\0",
                             1 + 4 + 8 + 8 + 2 + 2));
}

TEST(LeBytesTest, ReadsBackWhatWasWritten) {
  std::string out;
  LeWriter w(&out);
  w.U8(7);
  w.U32(0xdeadbeef);
  w.U64(~0ULL);
  w.I64(-12345);
  w.Bytes("tail");
  LeReader r(out);
  uint8_t a;
  uint32_t b;
  uint64_t c;
  int64_t d;
  absl::string_view e;
  ASSERT_TRUE(r.U8(&a) && r.U32(&b) && r.U64(&c) && r.I64(&d) &&
              r.Bytes(4, &e));
  EXPECT_EQ(a, 7);
  EXPECT_EQ(b, 0xdeadbeefu);
  EXPECT_EQ(c, ~0ULL);
  EXPECT_EQ(d, -12345);
  EXPECT_EQ(e, "tail");
  EXPECT_EQ(r.remaining(), 0u);
}

TEST(LeBytesTest, ShortInputIsRefusedWithoutConsumingIt) {
  const std::string three("\x01\x02\x03", 3);
  LeReader r(three);
  uint32_t v = 42;
  EXPECT_FALSE(r.U32(&v));
  EXPECT_EQ(v, 42u);
  EXPECT_EQ(r.remaining(), 3u);
  absl::string_view s;
  EXPECT_FALSE(r.Bytes(4, &s));
  EXPECT_FALSE(r.Skip(4));
  EXPECT_TRUE(r.Skip(3));
  uint8_t b;
  EXPECT_FALSE(r.U8(&b));
}

}  // namespace
}  // namespace hicache
