#pragma once

// Internal boundary between the NCCL link of a CP group
// (daemon/backend/cuda/nccl_communicator.h, host compiler) and its backend:
// nccl_link.cu (nvcc, with nccl.h) or no_nccl.cc (builds without NCCL).
// Plain types only.
//
// A link carries fixed-size chunks between two processes (two "sides"), one
// chunk at a time in each direction, over two 2-rank NCCL communicators (one
// per direction, so that the sending and the receiving thread never share
// one: NCCL calls on one communicator are not thread-safe). Chunks are
// staged through pinned host buffers into device buffers on the link's GPU,
// on one dedicated stream per direction.
//
// NCCL has no timeouts: a Send or Recv whose peer is gone blocks until
// RawNcclLinkAbort is called from another thread (the caller's watchdog),
// which makes it return kRawNcclAborted.
//
// Every function returns 0 on success, kRawNcclNotCompiled without NCCL,
// kRawNcclAborted after an abort, or an error code RawNcclErrorString names
// (CUDA errors as is, NCCL results as kRawNcclResultBase + result).

#include <cstddef>
#include <cstdint>

namespace hicache::cuda::raw {

inline constexpr int kRawNcclNotCompiled = -1;
inline constexpr int kRawNcclAborted = -2;
inline constexpr int kRawNcclResultBase = 100000;
inline constexpr size_t kRawNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES

bool RawNcclCompiled();
const char* RawNcclErrorString(int code);
// The NCCL version (e.g. 22809), or 0 without NCCL.
int RawNcclVersion();

// A fresh unique id (kRawNcclUniqueIdBytes), made by one side and handed to
// the other out of band (the group's join reply).
int RawNcclGetUniqueId(uint8_t* id);

// Opens this side (0 or 1) of a link on `device`: joins the communicator of
// `forward_id` (side 0 sends on it) and then of `backward_id` (side 1 sends
// on it). Blocks until the other side joins both. `chunk_bytes` > 0 is the
// size of every chunk, the same on both sides.
int RawNcclLinkOpen(void** link, const uint8_t* forward_id,
                    const uint8_t* backward_id, int side, int device,
                    size_t chunk_bytes);
// Sends one chunk of chunk_bytes bytes; blocks until the peer received it.
int RawNcclLinkSend(void* link, const void* chunk);
// Receives one chunk of chunk_bytes bytes into `chunk`; blocks until one
// arrives.
int RawNcclLinkRecv(void* link, void* chunk);
// Aborts both communicators: a blocked Send or Recv returns
// kRawNcclAborted, and so does every later one. Thread-safe; idempotent.
int RawNcclLinkAbort(void* link);
// Frees the link. No Send or Recv may be running or start.
void RawNcclLinkClose(void* link);

}  // namespace hicache::cuda::raw
