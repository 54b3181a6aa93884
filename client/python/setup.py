"""Builds the hicache wheel; metadata is in pyproject.toml.

build_py also generates the gRPC stubs from the repository's proto/ (or
$HICACHE_PROTO_DIR) into the built package, with Debian's protoc and
grpc_python_plugin (or $PROTOC and $GRPC_PYTHON_PLUGIN):

    hicache/v1/hicache_pb2.py, hicache_pb2_grpc.py     (hicache.v1)

protoc writes hicache.v1 where the package `hicache` already is, so its own
imports (`from hicache.v1 import ...`) hold unchanged. The gRPC health
service's stubs come from the grpcio-health-checking dependency
(`grpc_health.v1`).
"""

import os
import shutil
import subprocess
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = ("hicache/v1/hicache.proto",)


def _tool(env, name):
    path = os.environ.get(env) or shutil.which(name)
    if not path:
        raise RuntimeError(f"{name} not found (Debian: protobuf-compiler and "
                           f"protobuf-compiler-grpc), or set ${env}")
    return path


def generate_stubs(package_dir):
    """Writes the stubs under package_dir (the built `hicache` package)."""
    proto_dir = os.environ.get("HICACHE_PROTO_DIR") or os.path.join(HERE, "..", "..", "proto")
    proto_dir = os.path.abspath(proto_dir)
    for proto in PROTOS:
        if not os.path.exists(os.path.join(proto_dir, proto)):
            raise RuntimeError(f"{proto} not found under {proto_dir} (set $HICACHE_PROTO_DIR)")
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([_tool("PROTOC", "protoc"), f"-I{proto_dir}", "-I/usr/include",
                        f"--python_out={out}", f"--grpc_out={out}",
                        f"--plugin=protoc-gen-grpc={_tool('GRPC_PYTHON_PLUGIN', 'grpc_python_plugin')}",
                        *PROTOS], check=True)
        for source, target in (("hicache/v1", "v1"),):
            target_dir = os.path.join(package_dir, target)
            os.makedirs(target_dir, exist_ok=True)
            for name in sorted(os.listdir(os.path.join(out, source))):
                with open(os.path.join(out, source, name), encoding="utf-8") as f:
                    text = f.read()
                with open(os.path.join(target_dir, name), "w", encoding="utf-8") as f:
                    f.write(text)
        for package in ("v1",):
            init = os.path.join(package_dir, package, "__init__.py")
            with open(init, "w", encoding="utf-8") as f:
                f.write('"""Generated from proto/ when the wheel was built."""\n')


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        generate_stubs(os.path.join(self.build_lib, "hicache"))


setup(cmdclass={"build_py": BuildPyWithStubs})
