#include "daemon/radix/page_keys.h"

#include <algorithm>

#include "xxhash.h"

namespace hicache {

PageKeys::PageKeys(absl::string_view ns, absl::Span<const int32_t> tokens,
                   uint32_t page_size)
    : tokens_(tokens),
      page_size_(page_size),
      pages_((static_cast<int64_t>(tokens.size()) + page_size - 1) /
             page_size),
      seed_(XXH3_64bits(ns.data(), ns.size())) {}

uint64_t PageKeys::Next(uint64_t previous, absl::Span<const int32_t> page) {
  return XXH3_64bits_withSeed(page.data(), sizeof(int32_t) * page.size(),
                              previous);
}

uint64_t PageKeys::At(int64_t page) {
  while (static_cast<int64_t>(keys_.size()) <= page) {
    const int64_t i = static_cast<int64_t>(keys_.size());
    const int64_t from = i * page_size_;
    const int64_t count =
        std::min<int64_t>(page_size_, tokens_.size() - from);
    const uint64_t previous = keys_.empty() ? seed_ : keys_.back();
    keys_.push_back(Next(previous, tokens_.subspan(from, count)));
  }
  return keys_[page];
}

}  // namespace hicache
