// Input decoding of //fuzz:service_fuzzer: the byte reader, token sequences,
// counts, and the opcodes (the input format is documented at the top of
// service_fuzzer.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

namespace hicache::fuzz {

constexpr uint32_t kPageSize = 4;

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  size_t Below(size_t n) { return n == 0 ? 0 : Byte() % n; }
  bool Bit() { return (Byte() & 1) != 0; }
  // Mostly small values, sometimes an edge case.
  int64_t Count() {
    const uint8_t b = Byte();
    if (b < 224) return b % 20;
    static constexpr int64_t kEdges[] = {
        -1,
        -2,
        std::numeric_limits<int64_t>::min(),
        std::numeric_limits<int64_t>::max(),
        int64_t{1} << 31,
        int64_t{1} << 32,
        int64_t{1} << 62,
        int64_t{1} << 29,
        63,
        64,
        65,
        127,
        128,
        4096,
        -4096,
        (int64_t{1} << 31) - 1,
    };
    return kEdges[(b - 224) % std::size(kEdges)];
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

std::string Pack(const std::vector<int32_t>& tokens);

struct Tokens {
  std::vector<int32_t> tokens;
  bool malformed = false;  // Packed with a stray byte (not a multiple of 4).
  std::string Packed() const {
    std::string bytes = Pack(tokens);
    if (malformed) bytes.push_back('\x01');
    return bytes;
  }
};

// Tokens from one of the base sequences or from the input over {0, 1, 2},
// maybe with one token changed, maybe malformed.
Tokens ReadTokens(Input& in);

inline int64_t PagesFor(size_t tokens) {
  return static_cast<int64_t>((tokens + kPageSize - 1) / kPageSize);
}

// Token counts for reserve_tokens / extend_tokens: mostly small, sometimes an
// edge of the service's range [0, max_tokens_per_request = 2^24] or beyond.
int64_t TokenCount(Input& in);

// The opcodes: an op's opcode byte is taken modulo kNumOps.
enum Op : uint8_t {
  kOpen,
  kClose,
  kAllocate,
  kFree,
  kMatch,
  kInsert,
  kLock,
  kPin,
  kEvict,
  kSetFreeRoom,
  kPrepare,
  kLayerStored,
  kStoreAll,
  kRollback,
  kStreamEnd,
  kLoadBack,
  kFinishLoad,
  kSettle,
  kAdvanceClock,
  kKeepAlive,
  kInspect,
  kRequest,  // A whole request: match, allocate, back up, insert, unlock.
  // v1.1 (new opcodes only ever go here, at the end).
  kAdmit,
  kComplete,
  kUnlockHandles,
  kMatchExact,     // MatchPrefix with exact_tail (lock handles kept).
  kLoadBatch,      // LoadBack with items / extend_tokens.
  kFinishLoadRpc,  // The FinishLoad RPC.
  kWorkerStore,    // layer_stored with fences (a worker's rank share).
  kSubscribe,
  kUnsubscribe,
  kFence,       // RegisterFence / ReleaseFence.
  kBackupOpen,  // A BackupSession with a chosen mailbox bound.
  kFlow,        // A whole v1.1 request: Admit, layers, Complete.
  kHold,        // Copies are held in flight for the next few ops.
  kQuota,       // SetQuota (operator or not), then ListQuotas.
  kNumOps,
};

const char* OpName(int op);

}  // namespace hicache::fuzz
