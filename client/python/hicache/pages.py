"""Token ids and the daemon-issued values a session returns: `pack_tokens`
(the API's packed int32 tokens), `Handle` (an id tagged with its session
generation), and the tagged page sequences `PageList` and `Pages`."""

import array
from collections import abc
import sys
from typing import Optional, Sequence, Union

from hicache.rpc import pb

__all__ = ["Handle", "PageList", "Pages", "Tokens", "pack_tokens"]


Tokens = Union[bytes, bytearray, memoryview, "array.array", Sequence[int]]

_LITTLE = sys.byteorder == "little"
assert array.array("i").itemsize == 4, "hicache needs a 4-byte C int"


def pack_tokens(tokens: Tokens) -> bytes:
    """Token ids as the API carries them: packed little-endian int32.

    Already packed bytes (bytes, bytearray, memoryview) pass through
    unchanged; an array('i') is copied out in one step; any other sequence of
    ints is packed without a Python-level loop per token."""
    if isinstance(tokens, bytes):
        return tokens
    if isinstance(tokens, (bytearray, memoryview)):
        return bytes(tokens)
    if not isinstance(tokens, array.array) or tokens.typecode != "i":
        tokens = array.array("i", tokens)
    if not _LITTLE:
        tokens = array.array("i", tokens)
        tokens.byteswap()
    return tokens.tobytes()


def _token_count(packed: bytes) -> int:
    return len(packed) // 4


# A daemon-issued id (node, lock handle, backup, load or fence id) is an int
# of a subclass that names the session generation it came from; a call
# naming one of an older generation raises StaleHandleError.
class Handle(int):
    """An int the daemon issued, tagged with its session's `generation`.
    Pickled or copied, it is a plain int (no longer checked)."""
    __slots__ = ()
    generation = -1

    def __reduce__(self):
        return int, (int(self),)


_HANDLE_TYPES = {}


def _handle_type(generation: int):
    cls = _HANDLE_TYPES.get(generation)
    if cls is None:
        cls = _HANDLE_TYPES[generation] = type("Handle", (Handle,), {
            "__slots__": (), "generation": generation})
    return cls


def _oldest(*values) -> int:
    """The oldest generation any of `values` carries (-1: none)."""
    tags = [g for g in (getattr(v, "generation", None) for v in values)
            if g is not None and g >= 0]
    return min(tags) if tags else -1


class PageList(list):
    """A list of page ids tagged with its session's `generation`; slices
    and sums keep the tag (the oldest, when two are joined)."""
    __slots__ = ("generation",)

    def __init__(self, pages=(), generation=-1):
        super().__init__(pages)
        self.generation = generation

    def __getitem__(self, index):
        if isinstance(index, slice):
            return PageList(list.__getitem__(self, index), self.generation)
        return list.__getitem__(self, index)

    def __add__(self, other):
        return PageList(list.__add__(self, list(other)), _oldest(self, other))

    def __radd__(self, other):
        return PageList(list(other) + list(self), _oldest(self, other))


# The type of a protobuf repeated scalar field (C++, upb or pure Python).
_REPEATED_SCALARS = type(pb.Locations().pages)


class Pages(abc.Sequence):
    """Page ids kept in the parts they came in (protobuf repeated fields are
    not turned into Python ints one by one): a read-only sequence --
    len, iteration, indexing, ``==`` with any sequence, ``+`` --, and
    Session.complete copies its parts into the request as they are. Slice or
    ``list()`` it for a list."""

    __slots__ = ("parts", "generation")

    def __init__(self, *parts: Sequence[int], generation: Optional[int] = None):
        self.parts = parts
        if generation is None:  # A part's, where one carries it (a PageList).
            generation = next((g for g in (getattr(p, "generation", None) for p in parts)
                               if g is not None and g >= 0), None)
        self.generation = generation

    def __len__(self):
        return sum(len(part) for part in self.parts)

    def __iter__(self):
        for part in self.parts:
            yield from part

    def __getitem__(self, index):
        if isinstance(index, slice):
            parts = self.parts
            pages = parts[0][index] if len(parts) == 1 else list(self)[index]
            return PageList(pages, -1 if self.generation is None else self.generation)
        if index < 0:
            index += len(self)
        for part in self.parts:
            if 0 <= index < len(part):
                return part[index]
            index -= len(part)
        raise IndexError("page index out of range")

    def __add__(self, other: Sequence[int]) -> "Pages":
        return Pages(*self.parts, other, generation=_oldest(self, other))

    def __radd__(self, other: Sequence[int]) -> "Pages":
        return Pages(other, *self.parts, generation=_oldest(self, other))

    def __eq__(self, other):
        if isinstance(other, abc.Sequence) and not isinstance(other, (str, bytes)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None

    def __repr__(self):
        return f"Pages({list(self)})"


def _parts(pages):
    """The parts of a Pages, or (pages,) of any other sequence."""
    return pages.parts if isinstance(pages, Pages) else (pages,)


def _put_pages(field, pages):
    """Appends `pages` to a repeated field without a Python int per page
    where they are repeated fields already."""
    if isinstance(pages, _REPEATED_SCALARS):
        field.MergeFrom(pages)
    elif isinstance(pages, Pages):
        for part in pages.parts:
            _put_pages(field, part)
    elif pages:
        field.extend(pages)
