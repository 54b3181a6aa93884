// A scheduler or model-worker process for the multi-process tests.
//
//   kv_agent --socket=S --mode=write  --rank=R --pages=P0,P1,...
//       maps rank R's device segment and writes a distinct pattern into every
//       page it owns (lane R), for every family and layer; page i of the list
//       is the request's i-th page.
//   kv_agent --socket=S --mode=verify --rank=R --pages=...
//       checks that pattern; exit 1 (and a message) on the first wrong byte.
//   --seed=N (write, verify) varies the pattern per request.
//   In a CP group (docs/cp-groups.md) S is the socket of the daemon that
//   holds rank R's pools (the leader or a follower).
//   kv_agent --socket=S --mode=hold_scheduler
//       allocates, prepares a backup, stores one layer, caches and locks a
//       request, prints READY and sleeps: to be killed with SIGKILL.
//   kv_agent --socket=S --mode=hold_worker --rank=R
//       opens a worker session, maps its segment, prints READY and sleeps.
//   kv_agent --socket=S --mode=flow --seed=N
//       a scheduler running conversations for ever, as a serving engine
//       does with the daemon's defaults: each turn loads back a host hit,
//       admits (BACKUP_CHOICE_AUTO, a lane mode drawn per turn), stores
//       every layer of the backup Admit prepared and completes; it prints
//       "TURN n" after each. Three system
//       prompts are shared by every agent. To be SIGKILLed mid-flow; any
//       error from the daemon is printed and exits 1.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "client/cpp/endpoint.h"
#include "client/cpp/hicache_session.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"

ABSL_FLAG(std::string, socket, "", "Daemon socket.");
ABSL_FLAG(std::string, mode, "write",
          "write, verify, hold_scheduler, hold_worker, flow.");
ABSL_FLAG(uint32_t, rank, 0, "CP rank of a worker.");
ABSL_FLAG(std::string, pages, "", "The request's logical pages, in order.");
ABSL_FLAG(uint32_t, seed, 0,
          "Mixed into the write/verify pattern, so that two requests with "
          "the same page positions get different bytes (0: the original "
          "pattern).");

namespace hicache {
namespace {

uint8_t Pattern(int64_t position, int family, uint32_t layer, uint64_t byte,
                uint32_t seed) {
  // 97 is odd: seeds 0..255 shift every byte by a distinct amount mod 256.
  return static_cast<uint8_t>(position * 131 + family * 31 + layer * 7 +
                              byte * 13 + 1 + uint64_t{seed} * 97);
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "kv_agent: %s\n", message.c_str());
  return 1;
}

// --mode=flow (see the top of the file).
int RunFlow(client::Session& session, uint32_t page_size) {
  std::mt19937 rng(absl::GetFlag(FLAGS_seed));
  auto random_tokens = [&rng](int64_t n) {
    std::vector<int32_t> tokens(n);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 30000) + 1;
    return tokens;
  };
  std::vector<std::vector<int32_t>> prompts;
  {
    std::mt19937 shared(7);  // The same prompts in every agent.
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> prompt(3 * page_size + i);
      for (int32_t& t : prompt) t = static_cast<int32_t>(shared() % 30000) + 1;
      prompts.push_back(std::move(prompt));
    }
  }
  auto backups = session.OpenBackupStream();
  if (!backups.ok()) return Fail(std::string(backups.status().message()));
  auto layout = session.GetLayout();
  if (!layout.ok()) return Fail(std::string(layout.status().message()));
  const uint32_t steps = layout->num_steps();
  constexpr int kConversations = 4;
  std::vector<std::vector<int32_t>> history(kConversations);
  std::vector<int> turns(kConversations, 0);
  for (int64_t turn = 0;; ++turn) {
    const int c = static_cast<int>(rng() % kConversations);
    if (history[c].empty() || turns[c] >= 6) {
      history[c] = prompts[rng() % prompts.size()];
      turns[c] = 0;
    }
    std::vector<int32_t> tokens = history[c];
    const std::vector<int32_t> user =
        random_tokens(1 + static_cast<int64_t>(rng() % (2 * page_size)));
    tokens.insert(tokens.end(), user.begin(), user.end());
    const int64_t output = 1 + static_cast<int64_t>(rng() % page_size);
    // Every lane mode, so that lanes run short unevenly (per-lane eviction).
    constexpr v1::ComputeOwnerMode kModes[] = {
        v1::COMPUTE_OWNER_MODE_ROUND_ROBIN, v1::COMPUTE_OWNER_MODE_ZIGZAG,
        v1::COMPUTE_OWNER_MODE_UNSPECIFIED};
    auto admitted = session.Admit({client::MakeAdmitItem(
        tokens, output, kModes[rng() % 3], v1::BACKUP_CHOICE_AUTO)});
    if (!admitted.ok()) {
      return Fail("Admit: " + std::string(admitted.status().message()));
    }
    const v1::AdmitResult& a = admitted->results(0);
    if (a.load()) {
      // A host hit: load it back; the next turn of this conversation hits
      // it on the device.
      auto loaded = session.LoadBack(tokens, output);
      if (!loaded.ok()) {
        return Fail("LoadBack: " + std::string(loaded.status().message()));
      }
      if (loaded->lock_handle() != 0 &&
          !session.UnlockHandles({loaded->lock_handle()}).ok()) {
        return Fail("unlock after a load failed");
      }
      continue;
    }
    if (!a.admitted()) {  // The pool is busy with other requests: later.
      if (a.lock_handle() != 0 && !session.UnlockHandles({a.lock_handle()}).ok()) {
        return Fail("unlock of a refused admission failed");
      }
      continue;
    }
    if (a.backup_id() != 0) {
      for (uint32_t step = 0; step < steps; ++step) {
        if (absl::Status s = (*backups)->LayerStored({a.backup_id()}, step);
            !s.ok()) {
          return Fail("layer_stored: " + std::string(s.message()));
        }
      }
    }
    auto completed = session.Complete(
        {client::MakeCompleteItem(a, tokens, page_size)});
    if (!completed.ok()) {
      return Fail("Complete: " + std::string(completed.status().message()));
    }
    history[c] = std::move(tokens);
    const std::vector<int32_t> out = random_tokens(output);
    history[c].insert(history[c].end(), out.begin(), out.end());
    ++turns[c];
    std::printf("TURN %lld\n", static_cast<long long>(turn));
    std::fflush(stdout);
  }
}

int Run() {
  auto stub = std::shared_ptr<v1::HiCache::Stub>(v1::HiCache::NewStub(
      grpc::CreateChannel(client::UnixTarget(absl::GetFlag(FLAGS_socket)),
                          grpc::InsecureChannelCredentials())));
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const uint32_t rank = absl::GetFlag(FLAGS_rank);
  const bool worker = mode != "hold_scheduler" && mode != "flow";
  auto session = client::Session::Open(
      stub, "kv_agent-" + mode, worker ? v1::ROLE_WORKER : v1::ROLE_SCHEDULER,
      worker ? rank : 0, "", absl::Milliseconds(600));
  if (!session.ok()) return Fail(std::string(session.status().message()));
  auto layout = (*session)->GetLayout();
  if (!layout.ok()) return Fail(std::string(layout.status().message()));

  if (mode == "flow") {
    return RunFlow(**session, layout->geometry().page_size_tokens());
  }
  if (mode == "hold_scheduler") {
    v1::AllocateItem item;
    item.set_num_pages(3);
    auto allocation = (*session)->Allocate({item});
    if (!allocation.ok())
      return Fail(std::string(allocation.status().message()));
    grpc::ClientContext ctx;
    auto stream = stub->BackupSession(&ctx);
    v1::BackupClientMessage prepare;
    prepare.set_session_id((*session)->id());
    v1::BackupSpec* spec = prepare.mutable_prepare()->add_specs();
    *spec->mutable_pages() = allocation->allocations(0).pages();
    spec->set_logical_tokens(3 * layout->geometry().page_size_tokens());
    stream->Write(prepare);
    v1::BackupServerMessage reply;
    stream->Read(&reply);
    v1::BackupClientMessage stored;
    stored.set_session_id((*session)->id());
    stored.mutable_layer_stored()->add_backup_ids(
        reply.prepared().backup_ids(0));
    stored.mutable_layer_stored()->set_step(0);
    stream->Write(stored);
    // A second request, cached and locked.
    v1::AllocateItem two;
    two.set_num_pages(2);
    auto cached = (*session)->Allocate({two});
    if (!cached.ok()) return Fail(std::string(cached.status().message()));
    std::vector<int32_t> tokens(2 * layout->geometry().page_size_tokens(), 7);
    v1::InsertRequest insert;
    insert.add_items()->set_tokens(client::PackTokens(tokens));
    *insert.mutable_items(0)->mutable_pages() = cached->allocations(0).pages();
    if (!(*session)->Insert(insert).ok()) return Fail("insert failed");
    if (!(*session)->Match({tokens}, /*lock=*/true).ok())
      return Fail("match failed");
    std::printf("READY\n");
    std::fflush(stdout);
    while (true) pause();
  }

  const v1::RankSegments* segments = nullptr;
  for (const auto& r : layout->ranks()) {
    if (r.rank() == rank) segments = &r;
  }
  if (segments == nullptr) return Fail("no segments for this rank");
  auto device = client::MappedSegment::Map(segments->device());
  if (!device.ok()) return Fail(std::string(device.status().message()));
  if (mode == "hold_worker") {
    std::printf("READY\n");
    std::fflush(stdout);
    while (true) pause();
  }

  const uint32_t cp = layout->geometry().cp_size();
  const uint32_t seed = absl::GetFlag(FLAGS_seed);
  int64_t position = 0, checked = 0;
  for (absl::string_view text :
       absl::StrSplit(absl::GetFlag(FLAGS_pages), ',', absl::SkipEmpty())) {
    int64_t page = 0;
    if (!absl::SimpleAtoi(text, &page)) return Fail("bad --pages");
    const int64_t k = position++;
    if (page % cp != rank) continue;  // Another rank's page.
    for (int f = 0; f < layout->families_size(); ++f) {
      for (uint32_t l = 0; l < layout->families(f).num_layers(); ++l) {
        const uint64_t offset =
            client::DeviceBlockOffset(*layout, page / cp, f, l);
        if (page < 0 ||
            offset + client::BlockBytes(*layout, f) > (*device)->size()) {
          return Fail("page " + std::to_string(page) +
                      " lies outside rank " + std::to_string(rank) +
                      "'s device segment");
        }
        uint8_t* block = (*device)->data() + offset;
        for (uint64_t b = 0; b < client::BlockBytes(*layout, f); ++b) {
          if (mode == "write") {
            block[b] = Pattern(k, f, l, b, seed);
          } else if (block[b] != Pattern(k, f, l, b, seed)) {
            return Fail("wrong byte: position " + std::to_string(k) + " page " +
                        std::to_string(page) + " family " + std::to_string(f) +
                        " layer " + std::to_string(l) + " byte " +
                        std::to_string(b));
          }
        }
      }
    }
    ++checked;
  }
  std::printf("rank %u %s %lld pages\n", rank, mode.c_str(),
              static_cast<long long>(checked));
  return (*session)->Close().ok() ? 0 : 1;
}

}  // namespace
}  // namespace hicache

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return hicache::Run();
}
