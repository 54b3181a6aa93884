"""C++ (and later Python) code generation for .proto files with the system protoc.

Bazel 4 on Debian has no rules_proto/grpc rules offline, so generation is a genrule
running protoc with grpc_cpp_plugin. Proto sources live under //proto with import
paths relative to that directory (e.g. "hicache/v1/hicache.proto").
"""

def _stem(src):
    if not src.endswith(".proto"):
        fail("expected a .proto file, got " + src)
    return src[:-len(".proto")]

def cc_grpc_library(name, srcs, deps = [], grpc = True, **kwargs):
    """Generates and compiles protobuf (and gRPC service) code for `srcs`.

    Args:
      name: cc_library name.
      srcs: .proto files in this package, relative to it.
      deps: other cc_grpc_library targets whose protos these import.
      grpc: also generate gRPC service stubs.
      **kwargs: passed to the cc_library (visibility, ...).
    """
    outs = []
    hdrs = []
    for src in srcs:
        stem = _stem(src)
        hdrs.append(stem + ".pb.h")
        outs += [stem + ".pb.h", stem + ".pb.cc"]
        if grpc:
            hdrs.append(stem + ".grpc.pb.h")
            outs += [stem + ".grpc.pb.h", stem + ".grpc.pb.cc"]

    pkg = native.package_name()
    grpc_flags = ""
    if grpc:
        grpc_flags = "--grpc_out=$(GENDIR)/{pkg} --plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin) ".format(pkg = pkg)
    native.genrule(
        name = name + "_codegen",
        srcs = srcs + [d + "_srcs" for d in deps],
        outs = outs,
        cmd = ("protoc -I{pkg} -I/usr/include --cpp_out=$(GENDIR)/{pkg} " + grpc_flags +
               " ".join(["{pkg}/" + s for s in srcs])).format(pkg = pkg),
        message = "protoc " + name,
    )
    native.filegroup(name = name + "_srcs", srcs = srcs + [d + "_srcs" for d in deps])
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = hdrs,
        includes = ["."],
        deps = deps + [
            "@system_libs//:protobuf",
        ] + (["@system_libs//:grpcpp"] if grpc else []),
        **kwargs
    )
