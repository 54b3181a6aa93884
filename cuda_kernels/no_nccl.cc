// raw_nccl.h for builds without NCCL: every call reports kRawNcclNotCompiled.
#include "cuda_kernels/raw_nccl.h"

namespace hicache::cuda::raw {

bool RawNcclCompiled() { return false; }
const char* RawNcclErrorString(int code) {
  return code == kRawNcclAborted ? "the link was aborted"
                                 : "NCCL support was not compiled in";
}
int RawNcclVersion() { return 0; }
int RawNcclGetUniqueId(uint8_t*) { return kRawNcclNotCompiled; }
int RawNcclLinkOpen(void** link, const uint8_t*, const uint8_t*, int, int,
                    size_t) {
  *link = nullptr;
  return kRawNcclNotCompiled;
}
int RawNcclLinkSend(void*, const void*) { return kRawNcclNotCompiled; }
int RawNcclLinkRecv(void*, void*) { return kRawNcclNotCompiled; }
int RawNcclLinkAbort(void*) { return kRawNcclNotCompiled; }
void RawNcclLinkClose(void*) {}

}  // namespace hicache::cuda::raw
