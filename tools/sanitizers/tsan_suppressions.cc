// ThreadSanitizer suppressions compiled into every binary of a --config=tsan
// build (injected through --custom_malloc in .bazelrc; this file defines no
// allocator, so the default malloc stays in use).
//
// Debian's gRPC, Abseil, protobuf and OpenSSL (gRPC's TLS) are prebuilt
// without TSan. TSan sees their
// libc calls (epoll, memmove, new/delete) through its interceptors but not the
// atomics and futexes that order them, so it reports races that are entirely
// inside those libraries. Interceptor calls made from them are ignored here;
// gRPC's header-only templates (grpc::internal::CallOpSet and friends) are
// compiled into our binaries, instrumented, but synchronize through the
// uninstrumented completion queue; reports with gRPC frames are therefore
// suppressed too. Consequence: code reached from gRPC threads (the thin
// service layer) is checked less; the cache logic is exercised under TSan by
// its own multi-threaded unit tests, which involve no gRPC.
//
// Debian's libzmq (KV events) is prebuilt without TSan too: a message its
// I/O thread allocated and filled reaches the receiving thread through its
// own pipes and atomics, which TSan does not see, so it reports the
// receiver's read of the message as a race with libzmq's allocation.
//
// A connection SocketListener accepts is closed by gRPC, whose libc calls
// are ignored (above): TSan never sees the close, keeps the descriptor
// number attributed to the accept, and reports the next use of that number
// (an mmap of a shared-memory segment on another thread, say) as a race
// with accept4. The accept loop's own state is under its mutex.

extern "C" const char* __tsan_default_suppressions() {
  // `race:` templates match function, file or module names in either stack.
  return "called_from_lib:libgrpc.so\n"
         "called_from_lib:libgrpc++.so\n"
         "called_from_lib:libgpr.so\n"
         "race:libgrpc\n"
         "race:libgpr\n"
         "race:libabsl_\n"
         "race:libprotobuf\n"
         "race:libcrypto\n"
         "called_from_lib:libzmq.so\n"
         "race:libzmq\n"
         "race:libssl\n"
         "race:grpc::internal::\n"
         "race:grpc::Server::\n"
         "race:grpc_core::\n"
         "race:hicache::SocketListener::AcceptLoop\n";
}
