// LeakSanitizer suppressions compiled into every binary of a --config=asan
// build (injected through --custom_malloc in .bazelrc, as the TSan ones are;
// this file defines no allocator).
//
// Only leaks inside Debian's prebuilt third-party libraries belong here, each
// with the evidence. Everything of ours must stay leak-free.

extern "C" const char* __lsan_default_suppressions() {
  // c-ares (gRPC's DNS resolver, Debian libc-ares2 1.18): a TCP target such
  // as "localhost:PORT" leaves one 10-byte allocation of ares_init_options
  // that gRPC 1.51 never hands back (tests/client/hicache_client_test, whose
  // every allocation of ours is freed).
  return "leak:libcares.so\n";
}
