// The real hicached with --backend=cuda, driven from another process as a
// scheduler and the model workers of every rank would drive it: workers map
// the device pools by IPC handle, write KV with a kernel on their own stream,
// fence each layer with an interprocess event (registered once), the
// scheduler backs the request up layer by layer, an operator evicts it from
// the device, it is loaded back (workers wait on the load fences), and every
// byte is checked on every rank.
//
// On CI (no GPU) the daemon and this test both use the simulated CUDA runtime
// (--cuda_runtime=simulated): device memory is shared memory, so IPC memory
// handles work across the two processes; interprocess events do not, so the
// workers synchronise their stream before a layer_stored instead of naming a
// fence. With HICACHE_CUDA_RUNTIME=real (tools/gpu_check) everything runs on
// the GPU, fences included; the test skips when no GPU is visible.
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/endpoint.h"
#include "daemon/backend/cuda/real_cuda_runtime.h"
#include "daemon/backend/cuda/sim_cuda_runtime.h"
#include "gtest/gtest.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "tests/testing/binaries.h"
#include "tests/testing/cuda_runtime_mode.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tokens.h"

namespace hicache {
namespace {

using cuda::CopyRegion;
using testing::DaemonPath;
using testing::Pack;
using testing::Seq;
using testing::Subprocess;

constexpr uint32_t kCp = 2;


// The byte at `i` of the block (logical page, block index) a worker writes.
uint8_t Pattern(int64_t logical, uint32_t block, uint64_t i) {
  return static_cast<uint8_t>(logical * 131 + block * 17 + i * 7 + 1);
}

struct Case {
  std::string preset;
  uint32_t page_size;
  int pages;  // Pages of the request (alternating lanes).
};

class CudaDaemonTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (testing::RealCudaRuntimeRequested()) {
      runtime_ = std::make_unique<cuda::RealCudaRuntime>();
      absl::StatusOr<int> devices = runtime_->DeviceCount();
      if (!devices.ok() || *devices == 0) {
        GTEST_SKIP() << "HICACHE_CUDA_RUNTIME=real but no GPU is visible";
      }
    } else {
      runtime_ = std::make_unique<cuda::SimCudaRuntime>(
          cuda::SimOptions{.devices = static_cast<int>(kCp)});
    }
    const Case& c = GetParam();
    std::vector<std::string> argv = {
        DaemonPath(),
        "--socket=" + socket_,
        "--backend=cuda",
        absl::StrCat("--cuda_runtime=", testing::RealCudaRuntimeRequested() ? "real" : "simulated"),
        absl::StrCat("--cp_size=", kCp),
        "--kv_preset=" + c.preset,
        absl::StrCat("--page_size=", c.page_size),
        absl::StrCat("--device_pages_per_rank=", c.pages + 4),
        absl::StrCat("--host_pages_per_rank=", 2 * c.pages + 4),
        absl::StrCat("--operator_uids=", getuid()),
        "--copy_max_blocks=16"};
    // One GPU serves both ranks when the machine has one.
    if (testing::RealCudaRuntimeRequested() && *runtime_->DeviceCount() < static_cast<int>(kCp)) {
      argv.push_back("--gpus=0,0");
    }
    absl::StatusOr<Subprocess> daemon = Subprocess::Start(argv);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::make_unique<Subprocess>(*std::move(daemon));
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline && daemon_->Running()) {
      // A fresh channel per attempt: a failed connect would back off.
      stub_ = v1::HiCache::NewStub(grpc::CreateChannel(
          client::UnixTarget(socket_), grpc::InsecureChannelCredentials()));
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
      v1::GetStatsResponse stats;
      if (stub_->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok()) return;
      absl::SleepFor(absl::Milliseconds(50));
    }
    FAIL() << "hicached did not start:\n" << daemon_->Stderr();
  }

  void TearDown() override {
    if (daemon_ != nullptr) {
      stub_.reset();  // Our connection closes; shutdown need not wait for it.
      (void)daemon_->Signal(SIGTERM);
      absl::StatusOr<int> code = daemon_->Wait(absl::Seconds(20));
      EXPECT_TRUE(code.ok() && *code == 0) << daemon_->Stderr();
      if (getenv("DEBUG_DAEMON")) std::cerr << daemon_->Stderr();
    }
  }

  std::string OpenSession() {
    grpc::ClientContext ctx;
    v1::OpenSessionRequest request;
    request.set_client_name("cuda-daemon-test");
    request.set_role(v1::ROLE_SCHEDULER);
    v1::OpenSessionResponse response;
    EXPECT_TRUE(stub_->OpenSession(&ctx, request, &response).ok());
    return response.session_id();
  }

  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("hicached.sock");
  std::unique_ptr<cuda::CudaRuntime> runtime_;
  std::unique_ptr<Subprocess> daemon_;
  std::unique_ptr<v1::HiCache::Stub> stub_;
};

// One rank's worker: its view of the device pool, its compute stream, the
// rows it writes (staged in device memory) and its "layer written" fence.
struct Worker {
  int device = 0;
  char* pool = nullptr;
  uint64_t pool_bytes = 0;
  cuda::Stream stream = nullptr;
  cuda::Event written = nullptr;  // Interprocess (real runtime only).
  uint64_t fence_id = 0;
  char* staging = nullptr;        // [block][page i] rows, device memory.
  void* descriptors = nullptr;    // Pinned, for the copy launches.
  std::vector<int64_t> logical;   // This rank's pages of the request.
  std::vector<uint64_t> staged_at;  // Offset of each block's rows.
};

TEST_P(CudaDaemonTest, WorkersBackUpAndLoadBackEveryByteOverIpc) {
  const Case& c = GetParam();
  const std::string session = OpenSession();
  v1::GetLayoutResponse layout;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->GetLayout(&ctx, v1::GetLayoutRequest(), &layout).ok());
  }
  EXPECT_TRUE(layout.fences());
  EXPECT_EQ(layout.backend(), testing::RealCudaRuntimeRequested() ? "cuda" : "cuda (simulated)");
  ASSERT_EQ(layout.ranks_size(), static_cast<int>(kCp));
  const uint32_t blocks = layout.device_blocks_size();

  // Allocate the request's pages, alternating lanes.
  std::vector<int64_t> pages;
  {
    grpc::ClientContext ctx;
    v1::AllocateRequest request;
    request.set_session_id(session);
    v1::AllocateItem* item = request.add_items();
    for (int i = 0; i < c.pages; ++i) item->add_owners(i % kCp);
    v1::AllocateResponse response;
    ASSERT_TRUE(stub_->Allocate(&ctx, request, &response).ok());
    pages.assign(response.allocations(0).pages().begin(),
                 response.allocations(0).pages().end());
  }

  // Workers map their pools and stage the rows they will write.
  std::vector<Worker> workers(kCp);
  for (uint32_t r = 0; r < kCp; ++r) {
    Worker& w = workers[r];
    const v1::PoolSegment& segment = layout.ranks(r).device();
    ASSERT_EQ(segment.kind(), "cuda_ipc");
    ASSERT_EQ(segment.ipc_handle().size(), cuda::kIpcHandleBytes);
    w.device = segment.device();
    w.pool_bytes = segment.size_bytes();
    absl::StatusOr<void*> pool =
        runtime_->IpcOpenMemHandle(w.device, segment.ipc_handle());
    ASSERT_TRUE(pool.ok()) << pool.status();
    w.pool = static_cast<char*>(*pool);
    w.stream = *runtime_->CreateStream(w.device);
    for (int64_t p : pages) {
      if (static_cast<uint32_t>(p % kCp) == r) w.logical.push_back(p);
    }
    std::vector<char> rows;
    for (uint32_t b = 0; b < blocks; ++b) {
      w.staged_at.push_back(rows.size());
      for (int64_t p : w.logical) {
        for (uint64_t i = 0; i < layout.device_blocks(b).block_bytes(); ++i) {
          rows.push_back(static_cast<char>(Pattern(p, b, i)));
        }
      }
    }
    w.staging = static_cast<char*>(
        *runtime_->DeviceMalloc(w.device, std::max<size_t>(rows.size(), 4)));
    ASSERT_TRUE(runtime_->CopyToDevice(w.staging, rows.data(), rows.size()).ok());
    w.descriptors = *runtime_->HostAllocPinned(
        cuda::PackedCopyBytes(static_cast<int32_t>(blocks), c.pages));
    if (testing::RealCudaRuntimeRequested()) {
      w.written = *runtime_->CreateEvent(w.device, {.interprocess = true});
      grpc::ClientContext ctx;
      v1::RegisterFenceRequest request;
      request.set_session_id(session);
      request.set_rank(r);
      request.set_event_handle(*runtime_->IpcGetEventHandle(w.written));
      v1::RegisterFenceResponse response;
      grpc::Status status = stub_->RegisterFence(&ctx, request, &response);
      ASSERT_TRUE(status.ok()) << status.error_message();
      w.fence_id = response.fence_id();
    }
  }

  // The worker of rank r writes the blocks of `step` with one kernel launch
  // on its stream and marks the layer written.
  auto write_step = [&](Worker& w, uint32_t step) {
    const v1::StepBlocks& s = layout.steps(step);
    auto* regions = static_cast<CopyRegion*>(w.descriptors);
    const int64_t n = static_cast<int64_t>(w.logical.size());
    for (int i = 0; i < s.blocks_size(); ++i) {
      const v1::BlockAddress& a = layout.device_blocks(s.blocks(i));
      regions[i] = CopyRegion{.src_offset = w.staged_at[s.blocks(i)],
                              .dst_offset = a.offset(),
                              .bytes_per_page = a.block_bytes(),
                              .src_stride = a.block_bytes(),
                              .dst_stride = a.page_stride()};
    }
    auto* src = reinterpret_cast<int64_t*>(regions + s.blocks_size());
    int64_t* dst = src + n;
    for (int64_t i = 0; i < n; ++i) {
      src[i] = i;
      dst[i] = w.logical[i] / kCp;  // Physical page in the lane.
    }
    ASSERT_TRUE(runtime_
                    ->LaunchPageCopy({.src_base = w.staging,
                                      .dst_base = w.pool,
                                      .descriptors = w.descriptors,
                                      .num_regions = s.blocks_size(),
                                      .num_pages = n},
                                     w.stream)
                    .ok());
    if (w.written != nullptr) {
      ASSERT_TRUE(runtime_->RecordEvent(w.written, w.stream).ok());
    }
    // The descriptors are reused for the next step: without a fence the
    // worker must finish anyway; with one, only before reuse.
    ASSERT_TRUE(runtime_->SynchronizeStream(w.stream).ok());
  };

  // Backup, layer by layer, each layer fenced by every rank's event.
  grpc::ClientContext backup_ctx;
  auto stream = stub_->BackupSession(&backup_ctx);
  v1::BackupClientMessage prepare;
  prepare.set_session_id(session);
  v1::BackupSpec* spec = prepare.mutable_prepare()->add_specs();
  spec->mutable_pages()->Add(pages.begin(), pages.end());
  spec->set_logical_tokens(static_cast<int64_t>(c.pages) * c.page_size);
  ASSERT_TRUE(stream->Write(prepare));
  v1::BackupServerMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_TRUE(reply.has_prepared()) << reply.DebugString();
  const uint64_t backup = reply.prepared().backup_ids(0);
  ASSERT_NE(backup, 0u);
  for (uint32_t step = 0; step < layout.num_steps(); ++step) {
    v1::BackupClientMessage stored;
    stored.mutable_layer_stored()->add_backup_ids(backup);
    stored.mutable_layer_stored()->set_step(step);
    for (uint32_t r = 0; r < kCp; ++r) {
      ASSERT_NO_FATAL_FAILURE(write_step(workers[r], step));
      if (workers[r].fence_id != 0) {
        v1::RankFence* fence = stored.mutable_layer_stored()->add_fences();
        fence->set_rank(r);
        fence->set_fence_id(workers[r].fence_id);
      }
    }
    ASSERT_TRUE(stream->Write(stored));
  }
  const std::vector<int32_t> tokens = Seq(0, c.pages * c.page_size);
  {
    grpc::ClientContext ctx;
    v1::InsertRequest request;
    request.set_session_id(session);
    v1::InsertItem* item = request.add_items();
    item->set_tokens(Pack(tokens));
    item->mutable_pages()->Add(pages.begin(), pages.end());
    item->set_backup_id(backup);
    v1::InsertResponse inserted;
    ASSERT_TRUE(stub_->Insert(&ctx, request, &inserted).ok());
    ASSERT_TRUE(inserted.results(0).backup_attached());
  }
  bool committed = false;
  int steps_done = 0;
  while (!committed && stream->Read(&reply)) {
    committed = reply.has_committed();
    steps_done += reply.has_step_done();
    ASSERT_FALSE(reply.has_error()) << reply.DebugString();
  }
  ASSERT_TRUE(committed);
  EXPECT_EQ(steps_done, static_cast<int>(kCp * layout.num_steps()));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());

  // Scribble over the device pools, then evict everything from the device.
  for (Worker& w : workers) {
    ASSERT_TRUE(runtime_->Memset(w.pool, 0xEE, w.pool_bytes).ok());
  }
  {
    grpc::ClientContext ctx;
    v1::EvictRequest request;
    for (uint32_t r = 0; r < kCp; ++r) {
      request.add_device_pages_per_lane(c.pages + 3);
    }
    v1::EvictResponse response;
    ASSERT_TRUE(stub_->Evict(&ctx, request, &response).ok());
    EXPECT_EQ(response.device_pages_freed(), c.pages);
  }

  // Load back; each layer's fence orders the worker's reads after the copy.
  grpc::ClientContext load_ctx;
  v1::LoadBackRequest load_request;
  load_request.set_session_id(session);
  load_request.set_tokens(Pack(tokens));
  auto load = stub_->LoadBack(&load_ctx, load_request);
  v1::LoadBackEvent event;
  ASSERT_TRUE(load->Read(&event));
  ASSERT_TRUE(event.has_started()) << event.DebugString();
  ASSERT_EQ(event.started().loaded_tokens(), static_cast<int64_t>(tokens.size()));
  const std::vector<int64_t> loaded(event.started().locations().pages().begin(),
                                    event.started().locations().pages().end());
  int layers = 0;
  bool done = false;
  std::map<std::string, cuda::Event> opened;
  while (load->Read(&event)) {
    if (event.has_layer_loaded()) {
      ++layers;
      const std::string& fence = event.layer_loaded().fence();
      EXPECT_EQ(fence.size(), cuda::kIpcHandleBytes);
      if (testing::RealCudaRuntimeRequested()) {
        Worker& w = workers[event.layer_loaded().rank()];
        cuda::Event& e = opened[fence];
        if (e == nullptr) e = *runtime_->IpcOpenEventHandle(w.device, fence);
        ASSERT_TRUE(runtime_->StreamWaitEvent(w.stream, e).ok());
      }
    }
    if (event.has_done()) done = event.done().ok();
  }
  EXPECT_TRUE(load->Finish().ok());
  ASSERT_TRUE(done);
  EXPECT_EQ(layers, static_cast<int>(kCp * layout.num_steps()));

  // Every byte of every block of every loaded page, on every rank.
  for (uint32_t r = 0; r < kCp; ++r) {
    Worker& w = workers[r];
    ASSERT_TRUE(runtime_->SynchronizeStream(w.stream).ok());
    std::vector<char> bytes(w.pool_bytes);
    ASSERT_TRUE(runtime_->CopyToHost(bytes.data(), w.pool, w.pool_bytes).ok());
    int64_t checked = 0;
    for (size_t i = 0; i < loaded.size(); ++i) {
      if (static_cast<uint32_t>(loaded[i] % kCp) != r) continue;
      ASSERT_EQ(loaded[i] % kCp, pages[i] % kCp) << "owner pattern kept";
      for (uint32_t b = 0; b < blocks; ++b) {
        const v1::BlockAddress& a = layout.device_blocks(b);
        const char* block =
            bytes.data() + a.offset() + (loaded[i] / kCp) * a.page_stride();
        for (uint64_t k = 0; k < a.block_bytes(); ++k) {
          ASSERT_EQ(static_cast<uint8_t>(block[k]), Pattern(pages[i], b, k))
              << "rank " << r << " page " << i << " block " << b << " byte "
              << k;
        }
        ++checked;
      }
    }
    EXPECT_EQ(checked, static_cast<int64_t>(w.logical.size()) * blocks);
  }
  for (auto& [handle, e] : opened) EXPECT_TRUE(runtime_->DestroyEvent(e).ok());
  for (Worker& w : workers) {
    // The daemon's imported event must go before the exported one (CUDA:
    // using an imported event after its exporter destroyed it is undefined).
    if (w.fence_id != 0) {
      grpc::ClientContext ctx;
      v1::ReleaseFenceRequest request;
      request.set_session_id(session);
      request.set_fence_id(w.fence_id);
      v1::ReleaseFenceResponse response;
      EXPECT_TRUE(stub_->ReleaseFence(&ctx, request, &response).ok());
    }
    if (w.written != nullptr) {
      EXPECT_TRUE(runtime_->DestroyEvent(w.written).ok());
    }
    EXPECT_TRUE(runtime_->DestroyStream(w.stream).ok());
    EXPECT_TRUE(runtime_->HostFreePinned(w.descriptors).ok());
    EXPECT_TRUE(runtime_->DeviceFree(w.device, w.staging).ok());
    EXPECT_TRUE(runtime_->IpcCloseMemHandle(w.pool).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Geometries, CudaDaemonTest,
    ::testing::Values(Case{"tiny-draft", 4, 6},
                      Case{"deepseek-v3.2-fp8", 64, 4}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = info.param.preset;
      for (char& ch : name) {
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

}  // namespace
}  // namespace hicache
