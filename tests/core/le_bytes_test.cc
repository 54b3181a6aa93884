#include "daemon/core/le_bytes.h"

#include <cstdint>
#include <string>
#include <vector>

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

TEST(LeBytesTest, StringsAndArraysAreCountPrefixed) {
  std::string out;
  LeWriter w(&out);
  w.String("abc");
  w.String("");
  w.Array(std::vector<uint32_t>{1, 0xa0b0c0d0});
  w.Array(std::vector<int64_t>{-1, 0x0102030405060708});
  w.Array(std::vector<int32_t>{});
  EXPECT_EQ(out, std::string("\x03\0\0\0abc"
                             "\0\0\0\0"
                             "\x02\0\0\0\x01\0\0\0\xd0\xc0\xb0\xa0"
                             "\x02\0\0\0\xff\xff\xff\xff\xff\xff\xff\xff"
                             "\x08\x07\x06\x05\x04\x03\x02\x01"
                             "\0\0\0\0",
                             7 + 4 + 12 + 20 + 4));
  LeReader r(out);
  absl::string_view view;
  std::string copy = "old";
  std::vector<uint32_t> u32s;
  std::vector<int64_t> i64s = {5, 6, 7};
  std::vector<int32_t> none = {9};
  ASSERT_TRUE(r.String(&view) && r.String(&copy) && r.Array(&u32s) &&
              r.Array(&i64s) && r.Array(&none));
  EXPECT_EQ(view, "abc");
  EXPECT_EQ(copy, "");
  EXPECT_EQ(u32s, (std::vector<uint32_t>{1, 0xa0b0c0d0}));
  EXPECT_EQ(i64s, (std::vector<int64_t>{-1, 0x0102030405060708}));
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(r.remaining(), 0u);
}

TEST(LeBytesTest, ValuesAndCounts) {
  const std::string bytes("\x02\0\0\0\xff\xff\xff\xff\x07\0\0\0", 12);
  LeReader r(bytes);
  uint32_t n = 0;
  EXPECT_FALSE(r.Count(5, &n));  // 2 x 5 bytes do not fit in 8.
  EXPECT_EQ(r.remaining(), 12u);
  ASSERT_TRUE(r.Count(4, &n));
  EXPECT_EQ(n, 2u);
  std::vector<int32_t> tokens;
  EXPECT_FALSE(r.Values(3, &tokens));
  EXPECT_EQ(r.remaining(), 8u);
  ASSERT_TRUE(r.Values(2, &tokens));
  EXPECT_EQ(tokens, (std::vector<int32_t>{-1, 7}));
  EXPECT_EQ(r.remaining(), 0u);
  ASSERT_TRUE(r.Values(0, &tokens));
  EXPECT_TRUE(tokens.empty());
}

TEST(LeBytesTest, HostileCountsAreRefusedWithoutConsumingThem) {
  // A String, a Count and an Array each claiming more than what follows.
  const std::string bytes("\x05\0\0\0abcd", 8);
  LeReader r(bytes);
  absl::string_view view = "kept";
  std::string copy = "kept";
  uint32_t n = 42;
  std::vector<uint32_t> u32s = {3};
  EXPECT_FALSE(r.String(&view));
  EXPECT_FALSE(r.String(&copy));
  EXPECT_FALSE(r.Count(1, &n));
  EXPECT_FALSE(r.Array(&u32s));
  EXPECT_EQ(view, "kept");
  EXPECT_EQ(copy, "kept");
  EXPECT_EQ(n, 42u);
  EXPECT_EQ(u32s, std::vector<uint32_t>{3});
  EXPECT_EQ(r.remaining(), 8u);
  // A count of ~4G elements of 8 bytes: no overflow, refused.
  const std::string huge("\xff\xff\xff\xff", 4);
  LeReader h(huge);
  std::vector<uint64_t> u64s;
  EXPECT_FALSE(h.Array(&u64s));
  EXPECT_FALSE(h.Count(size_t{1} << 40, &n));
  EXPECT_TRUE(h.Count(0, &n));
  EXPECT_EQ(n, 0xffffffffu);
  // Too short for the count itself.
  LeReader s(absl::string_view("\x01\0", 2));
  EXPECT_FALSE(s.String(&view));
  EXPECT_FALSE(s.Count(0, &n));
  EXPECT_EQ(s.remaining(), 2u);
}

}  // namespace
}  // namespace hicache
