"""hicache.pools and hicache.cuda against a real hicached (CPU backend, C = 2,
P = 4, page-first host pools): bytes written through the shm mappings at the
layout's addresses are where the daemon's copies put them; GPU pools and
fences fail clearly without a GPU; DevicePool's __cuda_array_interface__."""

import dataclasses
import unittest
from unittest import mock

import grpc

import hicache
from hicache import cuda, pools
from hicache_proto.v1 import hicache_pb2 as pb
from daemon_fixture import Daemon

CP, P = 2, 4


def pattern(position, family, layer, nbytes):
    return bytes((position * 131 + family * 31 + layer * 7 + i * 13 + 1) & 0xFF
                 for i in range(nbytes))


def gpu_layout(layout):
    """`layout` (a hicache.Layout) with rank 0's device pool turned into a
    GPU pool."""
    device = dataclasses.replace(layout.ranks[0].device, kind="cuda_ipc", name="cuda:0:rank0",
                                 ipc_handle=bytes(64), device=0, pci_bus_id="0000:19:00.0")
    ranks = [dataclasses.replace(layout.ranks[0], device=device)] + layout.ranks[1:]
    return dataclasses.replace(layout, ranks=ranks)


class PoolsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon("--cp_size=2", "--page_size=4", "--kv_preset=tiny-draft",
                            "--device_pages_per_rank=8", "--host_pages_per_rank=16",
                            "--host_layout=page_first")
        cls.client = hicache.Client(cls.daemon.socket)
        cls.layout = cls.client.layout()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        assert cls.daemon.stop() == 0

    def write_device(self, ranks, pages):
        for position, page in enumerate(pages):
            device = ranks[page % CP].device
            for b in self.layout.device_blocks:
                offset, nbytes = device.block(b.family, b.layer, page // CP)
                device.write(offset, pattern(position, b.family, b.layer, nbytes))

    def check_device(self, ranks, pages):
        for position, page in enumerate(pages):
            device = ranks[page % CP].device
            for b in self.layout.device_blocks:
                offset, nbytes = device.block(b.family, b.layer, page // CP)
                self.assertEqual(device.read(offset, nbytes),
                                 pattern(position, b.family, b.layer, nbytes),
                                 f"position {position} block {b.family}/{b.layer}")

    def test_shm_bytes_travel_between_the_layouts_addresses(self):
        ranks = [hicache.map_rank(self.layout, r) for r in range(CP)]
        try:
            self.assertIsInstance(ranks[0].device, hicache.ShmPool)
            self.assertEqual(ranks[1].host.size, self.layout.ranks[1].host.size_bytes)
            tokens = list(range(700, 716))
            with self.client.session("py-pools") as s, s.backup_stream() as stream:
                pages = s.allocate(owners=[0, 1, 0, 1])
                self.write_device(ranks, pages)
                (backup,) = stream.prepare([(pages, len(tokens))])
                self.assertNotEqual(backup, 0)
                for step in range(self.layout.num_steps):
                    stream.layer_stored([backup], step)
                node = s.insert(tokens, pages, backup_id=backup).node
                self.assertEqual(stream.wait_committed(backup), node)
                # The host copies are at the host blocks' addresses of the
                # host pages the daemon reports (per rank, in page order).
                info = self.client.stub.InspectNode(pb.InspectNodeRequest(node=node))
                for rank in range(CP):
                    host_pages = list(info.host_pages_by_rank[rank].pages)
                    positions = [i for i, p in enumerate(pages) if p % CP == rank]
                    self.assertEqual(len(host_pages), len(positions))
                    for position, host_page in zip(positions, host_pages):
                        for b in self.layout.host_blocks:
                            offset, nbytes = ranks[rank].host.block(b.family, b.layer,
                                                                    host_page)
                            self.assertEqual(ranks[rank].host.read(offset, nbytes),
                                             pattern(position, b.family, b.layer, nbytes))
                # Evict, load back into fresh pages, read them there.
                self.client.evict(device_pages_per_lane=[7, 7])
                loaded = s.load_back(tokens)
                self.assertTrue(loaded.ok)
                self.assertEqual(loaded.loaded_tokens, len(tokens))
                self.check_device(ranks, loaded.pages)
                s.unlock([loaded.node])
        finally:
            for r in ranks:
                r.close()

    def test_block_lookup(self):
        with hicache.map_rank(self.layout, 1) as ranks:
            kv = self.layout.device_blocks[1]  # family 0 ("kv"), layer 1.
            self.assertEqual(ranks.device.block(0, 1, 5),
                             (kv.offset + 5 * kv.page_stride, kv.block_bytes))
            self.assertEqual(ranks.device.block(self.layout.families[0].name, 1, 5),
                             ranks.device.block(0, 1, 5))
            host = self.layout.host_blocks[2]
            self.assertGreater(host.page_stride, host.block_bytes)  # Page-first.
            self.assertEqual(ranks.host.block(host.family, host.layer, 15),
                             (host.offset + 15 * host.page_stride, host.block_bytes))
            with self.assertRaises(IndexError):
                ranks.device.block(0, 0, 8)
            with self.assertRaises(IndexError):
                ranks.host.block(0, 0, -1)
            with self.assertRaises(KeyError):
                ranks.device.block(0, 9, 0)
            with self.assertRaises(KeyError):
                ranks.device.block("nope", 0, 0)
        with self.assertRaises(KeyError):
            hicache.map_rank(self.layout, 5)

    def test_malformed_segments(self):
        device = self.layout.ranks[0].device
        with self.assertRaisesRegex(ValueError, "kind 'rdma'"):
            hicache.map_pool(dataclasses.replace(device, kind="rdma"))
        with self.assertRaises(FileNotFoundError):
            hicache.map_pool(dataclasses.replace(device, kind="shm",
                                                 name="/hicache-no-such-segment"))
        for size in (0, 63, 65):
            with self.assertRaisesRegex(ValueError, f"ipc_handle is {size} bytes"):
                hicache.map_pool(dataclasses.replace(device, kind="cuda_ipc",
                                                     ipc_handle=b"h" * size))

    def test_gpu_pool_without_libcudart(self):
        absent = cuda.CudaUnavailableError("libcudart could not be loaded: test")
        with mock.patch.object(pools, "_runtime", side_effect=absent):
            with self.assertRaises(hicache.CudaUnavailableError) as raised:
                hicache.map_rank(gpu_layout(self.layout), 0)
        message = str(raised.exception)
        self.assertTrue(message.startswith(
            "this pool is GPU memory (cuda_ipc) and libcudart could not be loaded: test"),
            message)
        self.assertIn("PCI 0000:19:00.0", message)
        self.assertIn("run the worker on the GPU node with CUDA installed", message)
        self.assertIsInstance(raised.exception, RuntimeError)

    def test_gpu_pool_with_this_machines_cuda_fails_cleanly(self):
        # No CUDA, a runtime without a GPU, or a GPU (a zero handle is invalid).
        with self.assertRaises(hicache.CudaError) as raised:
            hicache.map_rank(gpu_layout(self.layout), 0)
        message = str(raised.exception)
        self.assertTrue(message.startswith("this pool is GPU memory (cuda_ipc) and "), message)
        self.assertRegex(message, r"libcudart could not be loaded: |"
                                  r"cuda[A-Za-z]+(\([^)]*\))?: .*\(CUDA error [0-9]+\)")
        if isinstance(raised.exception, hicache.CudaUnavailableError):
            self.assertIn("run the worker on the GPU node with CUDA installed", message)
        # Rank 1 is still shm and maps.
        hicache.map_rank(gpu_layout(self.layout), 1).close()

    def test_cuda_array_interface(self):
        blocks = self.layout.device_blocks
        pool = hicache.DevicePool.for_testing(
            0x7F0000001000, 4096, blocks=blocks, num_pages=8,
            families=[f.name for f in self.layout.families])
        self.assertEqual(pool.__cuda_array_interface__, {
            "version": 3, "shape": (4096,), "typestr": "|u1",
            "data": (0x7F0000001000, False), "strides": None, "stream": None})
        self.assertEqual(pool.kind, "cuda_ipc")
        self.assertEqual(pool.block(0, 1, 2),
                         (blocks[1].offset + 2 * blocks[1].page_stride, blocks[1].block_bytes))
        pool.close()  # Nothing to unmap for a test pool.
        self.assertEqual(pool.__cuda_array_interface__["data"][0], 0x7F0000001000)


class FencesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon("--cp_size=2", "--page_size=4", "--kv_preset=tiny",
                            "--device_pages_per_rank=8", "--host_pages_per_rank=16")
        cls.client = hicache.Client(cls.daemon.socket)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        assert cls.daemon.stop() == 0

    def test_handles_and_streams(self):
        self.assertEqual(len(bytes(cuda.to_ipc_handle(bytes(range(64))))), 64)
        self.assertEqual(bytes(cuda.to_ipc_handle(bytes(range(64)))), bytes(range(64)))
        with self.assertRaisesRegex(ValueError, "fence is 3 bytes"):
            cuda.to_ipc_handle(b"abc", "fence")
        self.assertEqual(cuda.stream_handle(None), 0)
        self.assertEqual(cuda.stream_handle(1234), 1234)
        self.assertEqual(cuda.stream_handle(mock.Mock(spec=["cuda_stream"], cuda_stream=77)), 77)
        with self.assertRaises(TypeError):
            cuda.stream_handle("stream")

    def test_missing_runtime(self):
        with self.assertRaisesRegex(hicache.CudaUnavailableError,
                                    "^libcudart could not be loaded: .*/nope/libcudart.so"):
            cuda.CudaRuntime.load(["/nope/libcudart.so"])
        with self.assertRaisesRegex(hicache.CudaUnavailableError, "no symbol"):
            cuda.CudaRuntime.load(["libc.so.6"])

    def test_fences_fail_cleanly_or_work(self):
        try:
            runtime = cuda.runtime()
        except hicache.CudaUnavailableError as e:
            self.assertTrue(str(e).startswith("libcudart could not be loaded: "))
            self.skipTest(str(e))
        waiter = hicache.LoadFenceWaiter(0, runtime)
        waiter.wait(b"")  # A backend without events: nothing to wait on.
        with self.assertRaisesRegex(ValueError, "load fence is 63 bytes"):
            waiter.wait(bytes(63))
        with self.assertRaisesRegex(hicache.CudaError, r"^cuda[A-Za-z]+.*\(CUDA error \d+\)"):
            waiter.wait(bytes(64))  # A zero handle names no event anywhere.
        waiter.close()
        try:
            fence = hicache.LayerWrittenFence(0, runtime)
        except hicache.CudaUnavailableError as e:  # No GPU or driver here.
            self.assertRegex(str(e), r"^cuda[A-Za-z]+.*\(CUDA error \d+\)")
            return
        with fence:
            self.assertEqual(len(fence.handle), 64)
            fence.record(None)

    def test_fence_rpcs_on_the_cpu_backend(self):
        with self.client.session("py-fences") as s:
            with self.assertRaises(hicache.HiCacheError) as raised:
                s.register_fence(0, bytes(64))
            self.assertEqual(raised.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            with self.assertRaises(hicache.HiCacheError) as raised:
                s.release_fence(1)
            self.assertEqual(raised.exception.code, grpc.StatusCode.NOT_FOUND)
            with s.backup_stream() as stream:
                pages = s.allocate(num_pages=1)
                (backup,) = stream.prepare([(pages, 4)])
                seen = stream.events
                stream.layer_stored([backup], 0, fences={0: 42})
                # layer_stored has no reply; its error arrives on the stream.
                stream.wait_event(seen, timeout=10)
                (error,) = stream.errors()
                self.assertEqual(error[0], grpc.StatusCode.NOT_FOUND)
                self.assertIn("fences[0] = 42", error[1])
                self.assertEqual(stream.error_count, 1)


if __name__ == "__main__":
    unittest.main()
