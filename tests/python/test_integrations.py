"""docs/integrations.md stays honest: its Python snippets run, in order, in
one namespace, against a real daemon started with the flags the page names,
found through $HICACHE_SOCKET as the page says."""

import os
import re
import unittest
from unittest import mock

from daemon_fixture import Daemon

DOC = "docs/integrations.md"


def snippets(text):
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


class IntegrationsDocTest(unittest.TestCase):
    def test_the_snippets_run(self):
        with open(DOC) as f:
            text = f.read()
        # The daemon the page says it runs against.
        flags = re.search(r"^    hicached (--kv_preset=\S+ --page_size=\S+) \\\n"
                          r"^\s+(--device_pages_per_rank=\S+ --host_pages_per_rank=\S+)$",
                          text, re.M)
        self.assertIsNotNone(flags, "the page no longer names its daemon's flags")
        code = snippets(text)
        self.assertGreaterEqual(len(code), 4)
        daemon = Daemon(*flags.group(1).split(), *flags.group(2).split())
        try:
            env = {k: v for k, v in os.environ.items() if k != "HICACHE_TARGET"}
            env["HICACHE_SOCKET"] = daemon.socket
            with mock.patch.dict(os.environ, env, clear=True):
                namespace = {}
                for number, block in enumerate(code, 1):
                    with self.subTest(snippet=number):
                        exec(compile(block, f"{DOC} snippet {number}", "exec"), namespace)
                # Under the default write policy Admit prepared the backup the
                # worker snippet stored layer by layer.
                self.assertNotEqual(namespace["backup_id"], 0)
        finally:
            self.assertEqual(daemon.stop(), 0)


if __name__ == "__main__":
    unittest.main()
