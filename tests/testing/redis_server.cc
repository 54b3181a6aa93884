#include "tests/testing/redis_server.h"

#include <hiredis/hiredis.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace hicache::testing {

constexpr char kRedisServer[] = "/usr/bin/redis-server";

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start() {
  if (::access(kRedisServer, X_OK) != 0) {
    return absl::UnavailableError(
        "no /usr/bin/redis-server (Debian package redis-server; tools/dev "
        "installs it)");
  }
  std::unique_ptr<RedisServer> server(new RedisServer());
  server->socket_ = server->dir_.Child("redis.sock");
  if (absl::Status s = server->Launch(); !s.ok()) return s;
  return server;
}

absl::Status RedisServer::Launch() {
  auto process = Subprocess::Start({kRedisServer, "--port", "0", "--unixsocket",
                                    socket_, "--unixsocketperm", "700",
                                    "--save", "", "--appendonly", "no", "--dir",
                                    dir_.path(), "--daemonize", "no"});
  if (!process.ok()) return process.status();
  process_ = std::make_unique<Subprocess>(*std::move(process));
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    absl::StatusOr<std::string> pong = Command({"PING"});
    if (pong.ok() && *pong == "PONG") return absl::OkStatus();
    if (!process_->Running()) {
      return absl::UnavailableError(absl::StrCat(
          "redis-server exited: ", process_->Stderr(), process_->Stdout()));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError("redis-server did not answer PING");
}

RedisServer::~RedisServer() { Kill(); }

void RedisServer::Kill() {
  process_.reset();  // SIGKILLs and reaps.
  ::unlink(socket_.c_str());
}

absl::Status RedisServer::Restart() {
  Kill();
  return Launch();
}

absl::StatusOr<std::string> RedisServer::Command(
    const std::vector<std::string>& argv) const {
  redisContext* c = redisConnectUnix(socket_.c_str());
  if (c == nullptr || c->err != 0) {
    std::string why = c != nullptr ? c->errstr : "no memory";
    if (c != nullptr) redisFree(c);
    return absl::UnavailableError(why);
  }
  std::vector<const char*> args;
  std::vector<size_t> lengths;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lengths.push_back(a.size());
  }
  auto* r = static_cast<redisReply*>(redisCommandArgv(
      c, static_cast<int>(args.size()), args.data(), lengths.data()));
  if (r == nullptr) {
    std::string why = c->errstr;
    redisFree(c);
    return absl::UnavailableError(why);
  }
  std::string out;
  switch (r->type) {
    case REDIS_REPLY_NIL:
      out = "(nil)";
      break;
    case REDIS_REPLY_INTEGER:
      out = absl::StrCat(r->integer);
      break;
    default:
      out = std::string(r->str != nullptr ? r->str : "", r->len);
  }
  freeReplyObject(r);
  redisFree(c);
  return out;
}

}  // namespace hicache::testing
