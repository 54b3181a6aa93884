#include "bench/kv_event_sink.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

extern char** environ;

namespace hicache::bench {
namespace {

// Reads one line (without its newline) from `fd`; false at EOF or error.
bool ReadLine(int fd, std::string* line) {
  line->clear();
  char c;
  while (true) {
    const ssize_t n = read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (c == '\n') return true;
    line->push_back(c);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvEventSink>> KvEventSink::Start(
    const std::string& binary, const std::string& endpoint) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return absl::InternalError("pipe");
  }
  auto sink = std::unique_ptr<KvEventSink>(new KvEventSink());
  sink->to_child_ = in[1];
  sink->from_child_ = out[0];
  const std::string flag = absl::StrCat("--kv_event_sink=", endpoint);
  std::vector<char*> argv = {const_cast<char*>(binary.c_str()),
                             const_cast<char*>(flag.c_str()), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  const int rc = posix_spawn(&sink->pid_, binary.c_str(), &actions, nullptr,
                             argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  if (rc != 0) {
    sink->pid_ = -1;
    return absl::InternalError(
        absl::StrCat("posix_spawn ", binary, ": ", std::strerror(rc)));
  }
  std::string line;
  if (!ReadLine(sink->from_child_, &line) || line != "ready") {
    return absl::InternalError(
        absl::StrCat("the KV event sink did not start on ", endpoint));
  }
  return sink;
}

absl::StatusOr<KvEventSinkCounts> KvEventSink::Stop() {
  close(to_child_);
  to_child_ = -1;
  std::string line;
  const bool read = ReadLine(from_child_, &line);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  KvEventSinkCounts counts;
  std::vector<std::string> fields = absl::StrSplit(line, ' ');
  if (!read || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
      fields.size() != 2 || !absl::SimpleAtoi(fields[0], &counts.batches) ||
      !absl::SimpleAtoi(fields[1], &counts.bytes)) {
    return absl::InternalError(
        absl::StrCat("the KV event sink failed: '", line, "'"));
  }
  return counts;
}

KvEventSink::~KvEventSink() {
  if (to_child_ >= 0) close(to_child_);
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (from_child_ >= 0) close(from_child_);
}

int RunKvEventSink(const std::string& endpoint) {
  zmq::context_t context;
  zmq::socket_t sub(context, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.set(zmq::sockopt::rcvhwm, 0);  // Keep up or queue; never drop here.
  // The publisher binds once its replay starts: retry the connection
  // every millisecond until then (zmq's default waits 100 ms).
  sub.set(zmq::sockopt::reconnect_ivl, 1);
  sub.connect(endpoint);
  std::printf("ready\n");
  std::fflush(stdout);
  KvEventSinkCounts counts;
  bool stopping = false;
  while (true) {
    zmq::pollitem_t items[] = {
        {static_cast<void*>(sub), 0, ZMQ_POLLIN, 0},
        {nullptr, STDIN_FILENO, ZMQ_POLLIN, 0},
    };
    // Once told to stop: until the stream has been quiet for 200 ms.
    const int ready = zmq::poll(items, stopping ? 1 : 2,
                                std::chrono::milliseconds(stopping ? 200 : -1));
    if (ready == 0) break;  // Quiet while stopping.
    if (items[0].revents & ZMQ_POLLIN) {
      std::vector<zmq::message_t> frames;
      while (zmq::recv_multipart(sub, std::back_inserter(frames),
                                 zmq::recv_flags::dontwait)) {
        ++counts.batches;
        if (frames.size() == 3) {
          counts.bytes += static_cast<int64_t>(frames[2].size());
        }
        frames.clear();
      }
    }
    if (!stopping && (items[1].revents & (ZMQ_POLLIN | ZMQ_POLLERR))) {
      stopping = true;  // stdin closed (or anything written to it).
    }
  }
  std::printf("%lld %lld\n", static_cast<long long>(counts.batches),
              static_cast<long long>(counts.bytes));
  std::fflush(stdout);
  return 0;
}

}  // namespace hicache::bench
