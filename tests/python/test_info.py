"""hicache.info: the dataclasses Client.stats(), daemon_info() and layout()
return mirror their hicache.v1 messages field for field (so they cannot
drift from the proto), from_message converts every kind of field, and a
real daemon's answers come back as them."""

import dataclasses
import typing
import unittest

import hicache
from daemon_fixture import Daemon
from hicache import info
from hicache_proto.v1 import hicache_pb2 as pb

# Dataclass -> its message, where the names differ.
MESSAGE_OF = {"DaemonInfo": "GetStatsResponse", "Layout": "GetLayoutResponse"}
SCALARS = {int: ("TYPE_INT32", "TYPE_INT64", "TYPE_UINT32", "TYPE_UINT64"),
           float: ("TYPE_DOUBLE", "TYPE_FLOAT"), bool: ("TYPE_BOOL",),
           str: ("TYPE_STRING", "TYPE_ENUM"), bytes: ("TYPE_BYTES",)}
# Messages whose presence means something: Optional in the dataclasses.
OPTIONAL = {("RankSegments", "device"), ("RankSegments", "host"), ("DaemonInfo", "cp_group"),
            ("CpGroupStatus", "follower"), ("CpGroupMember", "transfer"),
            ("CpGroupMember", "events")}


def dataclasses_of_module():
    return {name: cls for name, cls in vars(info).items()
            if dataclasses.is_dataclass(cls) and isinstance(cls, type)}


def fill(message, depth=0):
    """Sets every field of `message` to a value that is not its default
    (two elements in repeated fields), nested messages included."""
    for f in message.DESCRIPTOR.fields:
        repeated = f.label == f.LABEL_REPEATED
        if f.type == f.TYPE_MESSAGE:
            if repeated:
                for _ in range(2):
                    fill(getattr(message, f.name).add(), depth + 1)
            else:
                fill(getattr(message, f.name), depth + 1)
            continue
        if f.type == f.TYPE_ENUM:
            value = f.enum_type.values[-1].number
        elif f.type == f.TYPE_BOOL:
            value = True
        elif f.type == f.TYPE_STRING:
            value = f"{f.name}-{depth}"
        elif f.type == f.TYPE_BYTES:
            value = f.name.encode()
        elif f.type in (f.TYPE_DOUBLE, f.TYPE_FLOAT):
            value = 1.5 + f.number
        else:
            value = f.number + 1000 * depth + (1 << 40 if "64" in str(f.type) else 0)
            value = f.number + 7 if f.type in (f.TYPE_INT32, f.TYPE_UINT32) else value
        if repeated:
            getattr(message, f.name).extend([value, value])
        else:
            setattr(message, f.name, value)
    return message


class InfoTest(unittest.TestCase):
    def test_every_dataclass_mirrors_its_message(self):
        classes = dataclasses_of_module()
        self.assertGreaterEqual(len(classes), 18)
        for name, cls in classes.items():
            with self.subTest(dataclass=name):
                descriptor = getattr(pb, MESSAGE_OF.get(name, name)).DESCRIPTOR
                self.assertEqual([f.name for f in dataclasses.fields(cls)],
                                 [f.name for f in descriptor.fields])
                hints = typing.get_type_hints(cls)
                for f in descriptor.fields:
                    hint = hints[f.name]
                    repeated = f.label == f.LABEL_REPEATED
                    if repeated:
                        self.assertIs(typing.get_origin(hint), list, f.name)
                        hint = typing.get_args(hint)[0]
                    if f.type == f.TYPE_MESSAGE:
                        if not repeated and (name, f.name) in OPTIONAL:
                            self.assertIs(typing.get_origin(hint), typing.Union, f.name)
                            hint = typing.get_args(hint)[0]
                        expected = {v: k for k, v in MESSAGE_OF.items()}.get(
                            f.message_type.name, f.message_type.name)
                        self.assertEqual(hint.__name__, expected, f.name)
                    else:
                        kinds = [k for k, v in SCALARS.items()
                                 if any(f.type == getattr(f, t) for t in v)]
                        self.assertEqual([hint], kinds, f.name)
        self.assertTrue(set(OPTIONAL) <= {(n, f.name) for n, c in classes.items()
                                          for f in dataclasses.fields(c)})

    def test_from_message_converts_every_field(self):
        for cls, message in ((info.CacheStats, pb.CacheStats()),
                             (info.DaemonInfo, pb.GetStatsResponse()),
                             (info.Layout, pb.GetLayoutResponse())):
            with self.subTest(dataclass=cls.__name__):
                fill(message)
                converted = info.from_message(cls, message)
                self.assertIsInstance(converted, cls)
                self.check_equal(converted, message)

    def check_equal(self, converted, message):
        for f in message.DESCRIPTOR.fields:
            value, original = getattr(converted, f.name), getattr(message, f.name)
            repeated = f.label == f.LABEL_REPEATED
            if f.type == f.TYPE_MESSAGE:
                if repeated:
                    self.assertEqual(len(value), len(original), f.name)
                    for v, o in zip(value, original):
                        self.check_equal(v, o)
                else:
                    self.check_equal(value, original)
            elif f.type == f.TYPE_ENUM:
                names = [f.enum_type.values_by_number[n].name
                         for n in (original if repeated else [original])]
                self.assertEqual(value, names if repeated else names[0], f.name)
            else:
                self.assertEqual(value, list(original) if repeated else original, f.name)

    def test_presence(self):
        empty = info.from_message(info.DaemonInfo, pb.GetStatsResponse())
        self.assertIsNone(empty.cp_group)  # A standalone daemon.
        self.assertEqual(empty.settings, info.EngineSettings())  # Always there.
        self.assertEqual(empty.backend, "BACKEND_UNSPECIFIED")
        message = pb.GetStatsResponse()
        message.cp_group.members.add().name = "a"
        group = info.from_message(info.DaemonInfo, message).cp_group
        self.assertIsNotNone(group)
        self.assertIsNone(group.follower)
        self.assertIsNone(group.members[0].transfer)
        self.assertEqual(group.members[0].name, "a")
        layout = pb.GetLayoutResponse()
        layout.ranks.add().host.kind = "shm"
        rank = info.from_message(info.Layout, layout).ranks[0]
        self.assertIsNone(rank.device)
        self.assertEqual(rank.host.kind, "shm")
        # An enum number this client does not know stays visible.
        stats = pb.GetStatsResponse(backend=77)
        self.assertEqual(info.from_message(info.DaemonInfo, stats).backend, "77")
        # Frozen.
        with self.assertRaises(dataclasses.FrozenInstanceError):
            empty.pid = 3

    def test_a_real_daemon_answers_with_dataclasses(self):
        daemon = Daemon("--page_size=4", "--kv_preset=tiny-draft", "--cp_size=2",
                        "--device_pages_per_rank=16", "--host_pages_per_rank=32")
        try:
            with hicache.Client(daemon.socket) as client:
                stats = client.stats()
                self.assertIsInstance(stats, hicache.CacheStats)
                self.assertEqual(len(stats.lanes), 2)
                self.assertEqual(stats.nodes, 0)
                about = client.daemon_info()
                self.assertIsInstance(about, hicache.DaemonInfo)
                self.assertEqual(about.backend, "BACKEND_CPU")
                self.assertEqual(about.geometry.cp_size, 2)
                self.assertEqual(about.settings.write_policy, "write_ahead")
                self.assertIsNone(about.cp_group)
                layout = client.layout()
                self.assertIsInstance(layout, hicache.Layout)
                self.assertEqual(layout.geometry.page_size_tokens, 4)
                self.assertEqual(len(layout.ranks), 2)
                self.assertTrue(all(r.host is not None for r in layout.ranks))
        finally:
            self.assertEqual(daemon.stop(), 0)


if __name__ == "__main__":
    unittest.main()
