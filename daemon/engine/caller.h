#pragma once

#include <string>
#include <utility>

namespace hicache {

// Who makes a request, as the transport proved it (unix peer credentials or
// a TLS client certificate). Operators may act across tenants (evict, set
// free room, dump and inspect the tree, list sessions, watch); every other
// caller is confined to the namespace and session it names.
struct Caller {
  bool is_operator = false;
  std::string name;  // For logs and errors: "uid 1000 pid 4242", "cert CN=x".
  // Who the caller is, stably across its connections: "uid 1000" (unix
  // peer credentials), "cert CN=x" (a TLS client certificate), "host
  // ipv4:10.0.0.7" (a TCP peer no certificate names: its address), or
  // empty when nothing identifies it (in-process servers). A session may be used only by callers of the principal that
  // opened it, and by operators (SessionManager::CheckCaller).
  std::string principal;

  static Caller Operator(std::string name = "in-process operator",
                         std::string principal = "") {
    return {true, std::move(name), std::move(principal)};
  }
  static Caller Client(std::string name = "client",
                       std::string principal = "") {
    return {false, std::move(name), std::move(principal)};
  }
};

}  // namespace hicache
