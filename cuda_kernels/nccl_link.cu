// raw_nccl.h over NCCL and the CUDA runtime (compiled by nvcc; host code
// only). See raw_nccl.h for the contract.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <new>

#include "cuda_kernels/raw_nccl.h"

namespace hicache::cuda::raw {
namespace {

static_assert(sizeof(ncclUniqueId) == kRawNcclUniqueIdBytes,
              "NCCL_UNIQUE_ID_BYTES changed");

int FromNccl(ncclResult_t r) {
  return r == ncclSuccess ? 0 : kRawNcclResultBase + static_cast<int>(r);
}

// One direction of a link: its communicator, stream and buffers.
struct Direction {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* device = nullptr;
  void* host = nullptr;  // Pinned.
  int peer = 0;
  // Held while NCCL calls on `comm` are enqueued (and checked `aborted`).
  std::timed_mutex enqueue;
};

struct Link {
  int device = 0;
  size_t chunk = 0;
  Direction send;
  Direction recv;
  std::atomic<bool> aborted{false};
};

int OpenDirection(Direction* d, const uint8_t* id, int rank, int peer,
                  size_t chunk) {
  ncclUniqueId unique;
  std::memcpy(&unique, id, sizeof(unique));
  if (int e = FromNccl(ncclCommInitRank(&d->comm, 2, unique, rank))) return e;
  d->peer = peer;
  if (cudaError_t e = cudaStreamCreateWithFlags(&d->stream,
                                                cudaStreamNonBlocking)) {
    return static_cast<int>(e);
  }
  if (cudaError_t e = cudaMalloc(&d->device, chunk)) return static_cast<int>(e);
  if (cudaError_t e = cudaMallocHost(&d->host, chunk)) {
    return static_cast<int>(e);
  }
  return 0;
}

void FreeDirection(Direction* d, bool comm_alive) {
  if (d->stream != nullptr) cudaStreamSynchronize(d->stream);
  if (comm_alive && d->comm != nullptr) ncclCommDestroy(d->comm);
  if (d->stream != nullptr) cudaStreamDestroy(d->stream);
  if (d->device != nullptr) cudaFree(d->device);
  if (d->host != nullptr) cudaFreeHost(d->host);
  d->comm = nullptr;
  d->stream = nullptr;
  d->device = nullptr;
  d->host = nullptr;
}

}  // namespace

bool RawNcclCompiled() { return true; }

const char* RawNcclErrorString(int code) {
  if (code == kRawNcclNotCompiled) return "NCCL support was not compiled in";
  if (code == kRawNcclAborted) return "the link was aborted";
  if (code >= kRawNcclResultBase) {
    return ncclGetErrorString(
        static_cast<ncclResult_t>(code - kRawNcclResultBase));
  }
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

int RawNcclVersion() {
  int version = 0;
  return ncclGetVersion(&version) == ncclSuccess ? version : 0;
}

int RawNcclGetUniqueId(uint8_t* id) {
  ncclUniqueId unique;
  if (int e = FromNccl(ncclGetUniqueId(&unique))) return e;
  std::memcpy(id, &unique, sizeof(unique));
  return 0;
}

int RawNcclLinkOpen(void** out, const uint8_t* forward_id,
                    const uint8_t* backward_id, int side, int device,
                    size_t chunk_bytes) {
  *out = nullptr;
  if ((side != 0 && side != 1) || chunk_bytes == 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (cudaError_t e = cudaSetDevice(device)) return static_cast<int>(e);
  Link* link = new (std::nothrow) Link;
  if (link == nullptr) return static_cast<int>(cudaErrorMemoryAllocation);
  link->device = device;
  link->chunk = chunk_bytes;
  // Forward: side 0 is rank 0 and sends to rank 1. Backward: side 1 is
  // rank 0 and sends to rank 1. Both sides join forward first.
  Direction* forward = side == 0 ? &link->send : &link->recv;
  Direction* backward = side == 0 ? &link->recv : &link->send;
  // In a 2-rank communicator the peer is the other rank: 1 - my rank.
  const int forward_rank = side;
  const int backward_rank = 1 - side;
  int e = OpenDirection(forward, forward_id, forward_rank, 1 - forward_rank,
                        chunk_bytes);
  if (e == 0) {
    e = OpenDirection(backward, backward_id, backward_rank,
                      1 - backward_rank, chunk_bytes);
  }
  if (e != 0) {
    FreeDirection(&link->send, true);
    FreeDirection(&link->recv, true);
    delete link;
    return e;
  }
  *out = link;
  return 0;
}

int RawNcclLinkSend(void* handle, const void* chunk) {
  Link* link = static_cast<Link*>(handle);
  Direction& d = link->send;
  if (cudaError_t e = cudaSetDevice(link->device)) return static_cast<int>(e);
  {
    std::lock_guard<std::timed_mutex> lock(d.enqueue);
    if (link->aborted.load()) return kRawNcclAborted;
    std::memcpy(d.host, chunk, link->chunk);
    if (cudaError_t e = cudaMemcpyAsync(d.device, d.host, link->chunk,
                                        cudaMemcpyHostToDevice, d.stream)) {
      return static_cast<int>(e);
    }
    if (int e = FromNccl(ncclSend(d.device, link->chunk, ncclUint8, d.peer,
                                  d.comm, d.stream))) {
      return e;
    }
  }
  const cudaError_t synced = cudaStreamSynchronize(d.stream);
  if (link->aborted.load()) return kRawNcclAborted;
  return static_cast<int>(synced);
}

int RawNcclLinkRecv(void* handle, void* chunk) {
  Link* link = static_cast<Link*>(handle);
  Direction& d = link->recv;
  if (cudaError_t e = cudaSetDevice(link->device)) return static_cast<int>(e);
  {
    std::lock_guard<std::timed_mutex> lock(d.enqueue);
    if (link->aborted.load()) return kRawNcclAborted;
    if (int e = FromNccl(ncclRecv(d.device, link->chunk, ncclUint8, d.peer,
                                  d.comm, d.stream))) {
      return e;
    }
    if (cudaError_t e = cudaMemcpyAsync(d.host, d.device, link->chunk,
                                        cudaMemcpyDeviceToHost, d.stream)) {
      return static_cast<int>(e);
    }
  }
  const cudaError_t synced = cudaStreamSynchronize(d.stream);
  if (link->aborted.load()) return kRawNcclAborted;
  if (synced != cudaSuccess) return static_cast<int>(synced);
  std::memcpy(chunk, d.host, link->chunk);
  return 0;
}

int RawNcclLinkAbort(void* handle) {
  Link* link = static_cast<Link*>(handle);
  if (link->aborted.exchange(true)) return 0;
  cudaSetDevice(link->device);
  // Once `aborted` is set, a Send or Recv that takes `enqueue` returns
  // without touching the communicator. Waiting for `enqueue` means no call
  // is between its check and its enqueue; but ncclSend/ncclRecv may block
  // (connecting to a peer that died), and ncclCommAbort is the call meant to
  // unblock them from another thread, so after a short wait it goes ahead.
  int result = 0;
  for (Direction* d : {&link->send, &link->recv}) {
    const bool locked = d->enqueue.try_lock_for(std::chrono::milliseconds(200));
    if (d->comm != nullptr) {
      if (int e = FromNccl(ncclCommAbort(d->comm))) result = e;
    }
    if (locked) d->enqueue.unlock();
  }
  return result;
}

void RawNcclLinkClose(void* handle) {
  Link* link = static_cast<Link*>(handle);
  if (link == nullptr) return;
  cudaSetDevice(link->device);
  const bool alive = !link->aborted.load();
  FreeDirection(&link->send, alive);
  FreeDirection(&link->recv, alive);
  delete link;
}

}  // namespace hicache::cuda::raw
