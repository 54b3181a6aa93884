// Host-tier journal benchmarks (daemon/persist, docs/hot-restart.md §9).
//
//   bazel run --config=opt //bench:journal_bench
//
// BM_JournalAppend: Put throughput through the writer with group commit
//   (max_delay 10 ms), the final Flush included: records/s and MB/s to disk.
// BM_JournalPutCallerCost: the time a Put costs the caller's thread
//   (validation + encoding + enqueue), per call: median_us and p99_us.
// BM_JournalLoad1MPages/C: LoadJournal of 62,500 Puts of 16 logical pages
//   (1M host pages in all, spread over C ranks), page size 64 tokens (so
//   1,024 edge tokens a Put), nodes in chains under 4,000 roots; the file is
//   in the page cache. median_ms is the p50 load time (issue 15: <= 2 s).
//
// Files go to $TEST_TMPDIR, else /tmp.
#include <stdlib.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/latencies.h"
#include "benchmark/benchmark.h"
#include "daemon/persist/journal_reader.h"
#include "daemon/persist/journal_writer.h"
#include "daemon/persist/state_dir.h"
#include "tests/persist/journal_test_util.h"

namespace hicache::persist {
namespace {

std::string MakeStateDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern =
      std::string(base != nullptr ? base : "/tmp") + "/journal-bench-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) return "";
  return pattern;
}

void RemoveStateDir(const std::string& dir) {
  ::unlink(JournalPath(dir).c_str());
  ::unlink(JournalTmpPath(dir).c_str());
  ::rmdir(dir.c_str());
}

JournalGeometry BenchGeometry(uint32_t cp) {
  JournalGeometry g = testing::TestGeometry(cp);
  g.page_size = 64;
  return g;
}

void BM_JournalAppend(benchmark::State& state) {
  const JournalGeometry g = BenchGeometry(1);
  const std::string dir = MakeStateDir();
  std::mt19937_64 rng(1);
  PutRecord put = testing::MakePut(1, 0, "ns", 16, g, rng);
  uint64_t bytes = 0;
  {
    auto writer =
        JournalWriter::Open(dir, g, {},
                            {.max_delay = absl::Milliseconds(10),
                             .compaction_floor_bytes = uint64_t{1} << 40});
    if (!writer.ok()) {
      state.SkipWithError("open failed");
      return;
    }
    uint64_t id = 0;
    for (auto _ : state) {
      put.persist_id = ++id;
      absl::Status s = (*writer)->Put(put);
      if (absl::IsResourceExhausted(s)) {
        s = (*writer)->Flush();  // Back-pressure: wait for the disk.
        if (s.ok()) s = (*writer)->Put(put);
      }
      if (!s.ok()) {
        state.SkipWithError(std::string(s.message()).c_str());
        break;
      }
    }
    if (!(*writer)->Flush().ok()) state.SkipWithError("flush failed");
    const JournalWriterStats stats = (*writer)->stats();
    bytes = stats.bytes_written;
    state.counters["batches"] = static_cast<double>(stats.batches);
    state.counters["records_per_batch"] =
        stats.batches > 0 ? static_cast<double>(stats.puts) / stats.batches : 0;
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  RemoveStateDir(dir);
}
BENCHMARK(BM_JournalAppend)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_JournalPutCallerCost(benchmark::State& state) {
  const JournalGeometry g =
      BenchGeometry(static_cast<uint32_t>(state.range(0)));
  const std::string dir = MakeStateDir();
  std::mt19937_64 rng(2);
  PutRecord put = testing::MakePut(1, 0, "ns", 16, g, rng);
  {
    auto writer =
        JournalWriter::Open(dir, g, {},
                            {.max_delay = absl::Milliseconds(10),
                             .max_queue_bytes = size_t{1} << 31,
                             .compaction_floor_bytes = uint64_t{1} << 40});
    if (!writer.ok()) {
      state.SkipWithError("open failed");
      return;
    }
    Latencies calls;
    uint64_t id = 0;
    for (auto _ : state) {
      put.persist_id = ++id;
      const absl::Status s = calls.Time([&] { return (*writer)->Put(put); });
      if (!s.ok()) {
        state.SkipWithError(std::string(s.message()).c_str());
        break;
      }
    }
    calls.Report(state);
    // After the timed loop: the writer drains before the next run.
    if (!(*writer)->Flush().ok()) state.SkipWithError("flush failed");
  }
  RemoveStateDir(dir);
}
BENCHMARK(BM_JournalPutCallerCost)->Arg(1)->Arg(4)->Iterations(200000);

// 62,500 Puts x 16 pages: chains of 15 under 4,167 roots.
std::vector<PutRecord> MillionPageLiveSet(const JournalGeometry& g) {
  std::mt19937_64 rng(3);
  std::vector<PutRecord> puts;
  constexpr uint64_t kPuts = 62500;
  puts.reserve(kPuts);
  for (uint64_t id = 1; id <= kPuts; ++id) {
    const uint64_t parent = id % 15 == 1 ? 0 : id - 1;
    puts.push_back(testing::MakePut(id, parent, "ns", 16, g, rng));
  }
  return puts;
}

void BM_JournalLoad1MPages(benchmark::State& state) {
  const JournalGeometry g =
      BenchGeometry(static_cast<uint32_t>(state.range(0)));
  const std::string dir = MakeStateDir();
  {
    auto writer = JournalWriter::Open(dir, g, MillionPageLiveSet(g));
    if (!writer.ok()) {
      state.SkipWithError(std::string(writer.status().message()).c_str());
      return;
    }
  }
  Latencies loads;
  int64_t pages = 0;
  uint64_t file_bytes = 0;
  double read_ms = 0, parse_ms = 0;
  for (auto _ : state) {
    absl::StatusOr<LoadedJournal> loaded =
        loads.Time([&] { return LoadJournal(dir, &g); });
    if (!loaded.ok() || loaded->puts.size() != 62500) {
      state.SkipWithError("load failed");
      break;
    }
    pages = 0;
    for (const PutRecord& put : loaded->puts) {
      pages += static_cast<int64_t>(put.page_owners.size());
    }
    file_bytes = loaded->file_bytes;
    read_ms = absl::ToDoubleMilliseconds(loaded->read_time);
    parse_ms = absl::ToDoubleMilliseconds(loaded->parse_time);
  }
  loads.Report(state);
  state.counters["median_ms"] = state.counters["median_us"] / 1000.0;
  state.counters["host_pages"] = static_cast<double>(pages);
  state.counters["file_MB"] = static_cast<double>(file_bytes) / 1e6;
  state.counters["last_read_ms"] = read_ms;
  state.counters["last_parse_ms"] = parse_ms;
  RemoveStateDir(dir);
}
BENCHMARK(BM_JournalLoad1MPages)
    ->Arg(1)
    ->Arg(4)
    ->Iterations(9)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace hicache::persist
