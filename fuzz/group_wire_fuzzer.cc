// Fuzz target: the CP group wire format (daemon/group/group_wire.h). Any
// bytes are decoded as a frame a hostile or broken peer sent; decoding must
// not crash, hang or allocate without bound (O(input)). Whatever decodes
// must re-encode to exactly the input (decoding is canonical) and decode
// again to the same frame. The header alone must decode whenever the frame
// does, and agree with it.
//
//   bazel build --config=fuzz //fuzz:group_wire_fuzzer
//   F=bazel-out/k8-fastbuildfuzz/bin/fuzz/group_wire_fuzzer
//   $F -max_total_time=60 CORPUS_DIR fuzz/corpus/group_wire
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "daemon/group/group_wire.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "group_wire_fuzzer: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<hicache::group::Frame> frame =
      hicache::group::DecodeFrame(input);
  absl::StatusOr<hicache::group::FrameHeader> header =
      hicache::group::DecodeFrameHeader(input);
  if (!frame.ok()) {
    Check(frame.status().code() == absl::StatusCode::kDataLoss ||
              frame.status().code() == absl::StatusCode::kInvalidArgument,
          "a refused frame is DATA_LOSS or INVALID_ARGUMENT");
    Check(!frame.status().message().empty(), "a refusal says why");
    return 0;
  }
  Check(header.ok() && *header == frame->header, "header agrees");
  Check(hicache::group::KindOf(frame->body) == frame->header.kind,
        "kind agrees with body");
  const std::string again = hicache::group::EncodeFrame(*frame);
  Check(again == input, "decoding is canonical");
  absl::StatusOr<hicache::group::Frame> twice =
      hicache::group::DecodeFrame(again);
  Check(twice.ok() && hicache::group::SameFrame(*frame, *twice),
        "round trip");
  return 0;
}
