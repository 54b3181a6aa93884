// The local storage tier's bandwidth against fio, side by side (issue 28,
// "Bandwidth"): FilePageStore writes and reads pages of --page_bytes with
// --queue_depth I/Os in flight on a file of --file_mib in --dir, then fio
// runs the same pattern (block size = the store's slot, the same queue
// depth, io_uring, O_DIRECT) on a file of the same size in the same
// directory. Runs alternate (store, fio, store, fio, ...) --runs times;
// the medians and their ratio are printed.
//
//   bazel run --config=opt //bench:storage_bench -- --dir=/mnt/nvme/bench
//
// The store's figure includes what it adds to the I/O: a copy into an
// aligned buffer, the page's checksum (XXH3) on write and its check on
// read, and the index.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "daemon/core/mutex.h"
#include "daemon/storage/file_page_store.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, dir, "/tmp/hicache-storage-bench",
          "Directory for the store's files and fio's (created; removed at "
          "the end).");
ABSL_FLAG(int64_t, page_bytes, 256 << 10,
          "Bytes a page (a multiple of 4 KiB "
          "keeps the slot the page).");
ABSL_FLAG(int64_t, file_mib, 1024, "Size of the store's file (and fio's).");
ABSL_FLAG(int, queue_depth, 32, "I/Os in flight.");
ABSL_FLAG(int, runs, 3, "Alternating runs of each.");
ABSL_FLAG(int, batch, 1,
          "Pages per store call (the engine's writer hands a store up to 64 "
          "queued pages at once); the queue depth counts pages.");
ABSL_FLAG(std::string, io, "io_uring", "The store's I/O: io_uring or threads.");

namespace hicache {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Keeps `depth` pages in flight, `batch` per call, until `pages` are done;
// returns MB/s. issue(first, count, done) starts pages [first, first+count).
template <typename Issue>
double Pump(int64_t pages, int depth, int batch, int64_t page_bytes,
            Issue issue) {
  Mutex mu;
  CondVar cv;
  int64_t in_flight = 0, failed = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < pages; i += batch) {
    const int64_t count = std::min<int64_t>(batch, pages - i);
    {
      MutexLock lock(&mu);
      while (in_flight + count > std::max<int64_t>(depth, count)) cv.Wait(&mu);
      in_flight += count;
    }
    issue(i, count, [&, count](const std::vector<absl::Status>& r) {
      MutexLock lock(&mu);
      in_flight -= count;
      for (const absl::Status& s : r) failed += s.ok() ? 0 : 1;
      cv.SignalAll();
    });
  }
  {
    MutexLock lock(&mu);
    while (in_flight > 0) cv.Wait(&mu);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (failed > 0) std::fprintf(stderr, "%lld I/Os failed\n", (long long)failed);
  return static_cast<double>(pages) * page_bytes / seconds / 1e6;
}

struct Pair {
  double write = 0, read = 0;
};

Pair RunStore(const std::string& dir, int64_t page_bytes, int64_t pages,
              int depth) {
  // The data file stays from run to run, as fio's does (the first run of
  // each writes a fresh, preallocated file); only the index goes, so the
  // store starts empty.
  std::filesystem::remove(dir + "/store/pages.index");
  FilePageStoreOptions o;
  o.directory = dir + "/store";
  o.page_bytes = page_bytes;
  o.capacity_pages = pages;
  o.queue_depth = depth;
  o.io = absl::GetFlag(FLAGS_io) == "threads"
             ? FilePageStoreOptions::Io::kThreads
             : FilePageStoreOptions::Io::kUring;
  auto store = FilePageStore::Open(std::move(o));
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    std::exit(1);
  }
  // `depth` distinct source buffers, random bytes.
  std::vector<std::vector<uint8_t>> buffers(depth,
                                            std::vector<uint8_t>(page_bytes));
  std::mt19937_64 rng(1);
  for (auto& b : buffers) {
    for (auto& x : b) x = static_cast<uint8_t>(rng());
  }
  const int batch = absl::GetFlag(FLAGS_batch);
  Pair out;
  out.write =
      Pump(pages, depth, batch, page_bytes,
           [&](int64_t first, int64_t count, auto done) {
             std::vector<StorePut> puts;
             for (int64_t i = first; i < first + count; ++i) {
               puts.push_back(
                   {StoreKey{1, static_cast<uint64_t>(i)}, buffers[i % depth]});
             }
             (*store)->Put(std::move(puts),
                           [done](std::vector<absl::Status> r) { done(r); });
           });
  std::vector<int64_t> order(pages);
  for (int64_t i = 0; i < pages; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::vector<uint8_t>> sinks(depth,
                                          std::vector<uint8_t>(page_bytes));
  std::atomic<int64_t> next_sink{0};
  out.read =
      Pump(pages, depth, batch, page_bytes,
           [&](int64_t first, int64_t count, auto done) {
             std::vector<StoreGet> gets;
             for (int64_t i = first; i < first + count; ++i) {
               auto& sink = sinks[next_sink++ % depth];
               gets.push_back({StoreKey{1, static_cast<uint64_t>(order[i])},
                               absl::MakeSpan(sink)});
             }
             (*store)->Get(std::move(gets),
                           [done](std::vector<absl::Status> r) { done(r); });
           });
  return out;
}

// fio's bandwidth (MB/s) for `rw` ("write" or "randread").
double RunFio(const std::string& dir, const std::string& rw, int64_t bs,
              int64_t bytes, int depth) {
  const std::string out = dir + "/fio.json";
  const std::string cmd = absl::StrCat(
      "fio --name=bench --filename=", dir, "/fio.dat --size=", bytes,
      " --bs=", bs, " --iodepth=", depth,
      " --ioengine=io_uring --direct=1 --rw=", rw,
      " --output-format=json --output=", out, " > /dev/null 2>&1");
  if (std::system(cmd.c_str()) != 0) return -1;
  FILE* f = std::fopen(out.c_str(), "r");
  if (f == nullptr) return -1;
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  std::fclose(f);
  const auto json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded()) return -1;
  const auto& job = json["jobs"][0];
  const auto& side = rw == "write" ? job["write"] : job["read"];
  return side["bw_bytes"].get<double>() / 1e6;
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const int64_t page = absl::GetFlag(FLAGS_page_bytes);
  const int64_t slot = (page + 4095) / 4096 * 4096;
  const int64_t bytes = absl::GetFlag(FLAGS_file_mib) << 20;
  const int64_t pages = bytes / slot;
  const int depth = absl::GetFlag(FLAGS_queue_depth);
  std::filesystem::create_directories(dir);
  const bool have_fio = std::system("fio --version > /dev/null 2>&1") == 0;
  std::vector<double> sw, sr, fw, fr;
  for (int run = 0; run < absl::GetFlag(FLAGS_runs); ++run) {
    const Pair s = RunStore(dir, page, pages, depth);
    sw.push_back(s.write);
    sr.push_back(s.read);
    if (have_fio) {
      fw.push_back(RunFio(dir, "write", slot, pages * slot, depth));
      fr.push_back(RunFio(dir, "randread", slot, pages * slot, depth));
    }
    std::printf("run %d: store write %.0f read %.0f MB/s", run, s.write,
                s.read);
    if (have_fio) {
      std::printf("; fio write %.0f randread %.0f MB/s", fw.back(), fr.back());
    }
    std::printf("\n");
  }
  std::printf(
      "pages of %lld bytes (slots of %lld), %lld MiB, queue depth %d, %d "
      "pages a call, %s\n",
      (long long)page, (long long)slot, (long long)(bytes >> 20), depth,
      absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_io).c_str());
  std::printf("median write: store %.0f MB/s", Median(sw));
  if (have_fio) {
    std::printf(", fio %.0f MB/s, ratio %.2f", Median(fw),
                Median(sw) / Median(fw));
  }
  std::printf("\nmedian read:  store %.0f MB/s", Median(sr));
  if (have_fio) {
    std::printf(", fio %.0f MB/s, ratio %.2f", Median(fr),
                Median(sr) / Median(fr));
  } else {
    std::printf(" (fio not found: install Debian's fio to compare)");
  }
  std::printf("\n");
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace hicache

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return hicache::Main();
}
