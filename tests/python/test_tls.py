"""TLS and mTLS between hicache.Client and a real hicached listening on TCP
(--listen_tcp with --tls_cert_file/--tls_key_file[/--tls_client_ca_file]).
Certificates are made at test time with openssl: a CA, a server
certificate for 127.0.0.1 and localhost, a client certificate, and a second
CA that signed neither (the test is skipped, saying why, without openssl)."""

import os
import shutil
import socket
import subprocess
import tempfile
import unittest

import grpc

import hicache
from daemon_fixture import Daemon

OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"
FLAGS = ("--page_size=4", "--kv_preset=tiny-draft", "--device_pages_per_rank=16",
         "--host_pages_per_rank=16")


def _openssl(*args, cwd):
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)


def _make_pki(d):
    """ca.pem/ca.key, server.pem/.key (SAN 127.0.0.1, localhost, signed by
    ca), client.pem/.key (signed by ca), other-ca.pem, rogue.pem/.key
    (signed by other-ca)."""
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", *key, "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                 "-subj", f"/CN=hicache test {ca}", "-days", "1", cwd=d)
    leaves = (("server", "ca", "/CN=localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
              ("client", "ca", "/CN=scheduler", "extendedKeyUsage=clientAuth"),
              ("rogue", "other-ca", "/CN=rogue", "extendedKeyUsage=clientAuth"))
    for name, ca, subject, extension in leaves:
        _openssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subject, cwd=d)
        with open(os.path.join(d, f"{name}.ext"), "w", encoding="utf-8") as f:
            f.write(extension + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey",
                 f"{ca}.key", "-CAcreateserial", "-out", f"{name}.pem", "-days", "1",
                 "-extfile", f"{name}.ext", cwd=d)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TlsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pki = tempfile.mkdtemp(prefix="hicache-tls-", dir="/tmp")
        if not os.path.exists(OPENSSL):
            raise unittest.SkipTest(f"no openssl at {OPENSSL} to make test certificates")
        try:
            _make_pki(cls.pki)
        except subprocess.CalledProcessError as e:
            raise unittest.SkipTest(f"openssl could not make certificates: "
                                    f"{e.stderr.decode(errors='replace')}") from None
        cls.port = _free_port()
        cls.mtls_port = _free_port()
        cls.tls = Daemon(*FLAGS, f"--listen_tcp=127.0.0.1:{cls.port}",
                         f"--tls_cert_file={cls.file('server.pem')}",
                         f"--tls_key_file={cls.file('server.key')}")
        cls.mtls = Daemon(*FLAGS, f"--listen_tcp=127.0.0.1:{cls.mtls_port}",
                          f"--tls_cert_file={cls.file('server.pem')}",
                          f"--tls_key_file={cls.file('server.key')}",
                          f"--tls_client_ca_file={cls.file('ca.pem')}")

    @classmethod
    def tearDownClass(cls):
        for daemon in ("tls", "mtls"):
            if hasattr(cls, daemon):
                getattr(cls, daemon).stop()
        shutil.rmtree(cls.pki, ignore_errors=True)

    @classmethod
    def file(cls, name):
        return os.path.join(cls.pki, name)

    def _works(self, client):
        self.assertTrue(client.tls)
        self.assertEqual(client.health(), "SERVING")
        with client.session("tls") as s:
            tokens = list(range(10, 18))
            (a,) = s.admit([tokens])
            s.complete([hicache.CompleteItem(tokens, a.request_pages)])
            self.assertEqual(s.match([tokens], peek=True)[0].device_tokens, 8)

    def _fails(self, client, *hints):
        with client, self.assertRaises(hicache.HiCacheError) as raised:
            client.health()
        self.assertIn(raised.exception.code,
                      (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED))
        for hint in hints:
            self.assertIn(hint, str(raised.exception))
        return raised.exception

    def test_tls_with_the_ca_file(self):
        with hicache.Client(target=f"127.0.0.1:{self.port}",
                            tls_ca_file=self.file("ca.pem")) as client:
            self._works(client)

    def test_tls_with_root_certificates_and_a_host_name(self):
        with open(self.file("ca.pem"), "rb") as f:
            roots = f.read()
        with hicache.Client(target=f"localhost:{self.port}", root_certificates=roots) as client:
            self._works(client)

    def test_without_the_ca_the_server_is_not_trusted(self):
        # The system's roots did not sign the test CA.
        error = self._fails(hicache.Client(target=f"127.0.0.1:{self.port}", timeout=5,
                                           wait_for_ready=False),
                            "TLS to 127.0.0.1", "no tls_ca_file given")
        print(f"\n  no CA: {error}")
        # Nor does another CA.
        self._fails(hicache.Client(target=f"127.0.0.1:{self.port}", timeout=5,
                                   wait_for_ready=False,
                                   tls_ca_file=self.file("other-ca.pem")), "other-ca.pem")

    def test_a_name_the_certificate_does_not_hold_is_refused(self):
        self._fails(hicache.Client(target=f"127.0.0.1:{self.port}", timeout=5,
                                   wait_for_ready=False, tls_ca_file=self.file("ca.pem"),
                                   tls_server_name="cache.example"), "tls_server_name")

    def test_plain_tcp_cannot_talk_to_the_tls_port(self):
        self._fails(hicache.Client(target=f"127.0.0.1:{self.port}", timeout=3,
                                   wait_for_ready=False, insecure_tcp_for_testing=True),
                    "plain TCP")

    def test_mtls(self):
        with hicache.Client(target=f"127.0.0.1:{self.mtls_port}",
                            tls_ca_file=self.file("ca.pem"),
                            tls_cert_file=self.file("client.pem"),
                            tls_key_file=self.file("client.key")) as client:
            self._works(client)

    def test_mtls_without_a_client_certificate_fails(self):
        error = self._fails(hicache.Client(target=f"127.0.0.1:{self.mtls_port}", timeout=5,
                                           wait_for_ready=False,
                                           tls_ca_file=self.file("ca.pem")),
                            "tls_cert_file")
        print(f"\n  mTLS without a client certificate: {error}")

    def test_mtls_with_a_certificate_of_another_ca_fails(self):
        self._fails(hicache.Client(target=f"127.0.0.1:{self.mtls_port}", timeout=5,
                                   wait_for_ready=False, tls_ca_file=self.file("ca.pem"),
                                   tls_cert_file=self.file("rogue.pem"),
                                   tls_key_file=self.file("rogue.key")))

    def test_bad_options_are_refused_before_connecting(self):
        tcp = f"127.0.0.1:{self.port}"
        bad = [
            dict(socket_path="/tmp/x.sock", tls_ca_file=self.file("ca.pem"),
                 follow_leader=False),
            dict(target="unix:/tmp/x.sock", insecure_tcp_for_testing=True,
                 follow_leader=False),
            dict(target=tcp, tls_ca_file=self.file("ca.pem"), insecure_tcp_for_testing=True),
            dict(target=tcp, tls_cert_file=self.file("client.pem")),
            dict(target=tcp, tls_key_file=self.file("client.key")),
            dict(target=tcp, tls_ca_file=self.file("ca.pem"), root_certificates=b"x"),
            dict(socket_path="/tmp/x.sock", target=tcp),
        ]
        for kwargs in bad:
            with self.assertRaises(ValueError, msg=str(kwargs)):
                hicache.Client(**kwargs)
        with self.assertRaises(ValueError) as raised:
            hicache.Client(target=tcp, tls_ca_file=self.file("missing.pem"))
        self.assertIn("missing.pem", str(raised.exception))


if __name__ == "__main__":
    unittest.main()
