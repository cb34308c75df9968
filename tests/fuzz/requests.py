"""Hypothesis strategies that build any request of the public gRPC API from its protobuf descriptor.

Values lean towards what breaks servers: names that are almost valid (a trailing newline, control
characters, one character too long, a derived dead-letter name too long), integers at every type's
edges and beyond every documented maximum, unknown enum values, and position tokens of the right
size with forged contents next to wrong-sized ones. Names of real topics and groups are mixed in so
that requests get past the first lookup.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from broker.core import records

F = FieldDescriptor
DEPTH_MAX = 3
REPEATED_MAX = 3
_RANGES = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1), F.TYPE_SINT32: (-(2**31), 2**31 - 1), F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    F.TYPE_INT64: (-(2**63), 2**63 - 1), F.TYPE_SINT64: (-(2**63), 2**63 - 1), F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1), F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1), F.TYPE_FIXED64: (0, 2**64 - 1),
}
_EDGES = [0, 1, 2, 3, -1, 100, 1000, 60_000, 12 * 3600 * 1000, 12 * 3600 * 1000 + 1, 10 * 365 * 86_400_000,
          2**31 - 1, 2**31, -(2**31), 2**32 - 1, 2**53, 2**63 - 1, -(2**63), 2**64 - 1]


def message_class(descriptor: Descriptor) -> type[Message]:
    cls: type[Message] = message_factory.GetMessageClass(descriptor)
    return cls


class RequestStrategies:
    """Strategies for the requests of a live cluster whose known names are ``topics`` / ``groups``;
    ``incarnations`` are the known topics' ids (forged tokens use them to pass the first checks)."""

    def __init__(self, topics: list[str], groups: list[str], incarnations: list[int]) -> None:
        almost = ["", " ", "a b", "-x", ".x", "x" * 249, "x" * 250, "ü", "\x00", "a\x7f", "a/b", "a\tb", "..",
                  "dlq.dlq"]
        near = [f"{n}\n" for n in topics + groups] + [f"{n}\r\n" for n in groups] + almost
        self.topic_names = _weighted((7, st.sampled_from(topics)), (2, st.sampled_from(near)),
                                     (1, st.text(max_size=12)))
        self.group_names = _weighted((7, st.sampled_from(groups)), (2, st.sampled_from(near)),
                                     (1, st.text(max_size=12)))
        self.names = _weighted((4, st.sampled_from(topics + groups)), (3, st.sampled_from(near)),
                               (3, st.text(max_size=12)))
        tokens = st.builds(lambda i, p, o, d: records.PositionToken(i, p, o, d).encode(),
                           _weighted((3, st.sampled_from(incarnations)), (2, st.integers(1, 64)),
                                     (1, st.sampled_from([0, 2**32 - 1]))),
                           st.sampled_from([0, 0, 1, 7, 2**32 - 1]),
                           st.sampled_from([0, 1, 1, 2, 5, 2**63, 2**64 - 1]),
                           st.sampled_from([0, 0, 1, 2**64 - 1]))  # a delivery (version 2) or none
        self.bytes = _weighted((6, tokens), (3, st.binary(max_size=40)), (1, st.just(b"")))
        self._cache: dict[str, st.SearchStrategy[Message]] = {}

    def request(self, method: MethodDescriptor) -> st.SearchStrategy[Message]:
        return self.message(method.input_type, 0)

    def message(self, descriptor: Descriptor, depth: int) -> st.SearchStrategy[Message]:
        key = f"{descriptor.full_name}/{depth}"
        if key not in self._cache:
            self._cache[key] = self._build(descriptor, depth)
        return self._cache[key]

    def _build(self, descriptor: Descriptor, depth: int) -> st.SearchStrategy[Message]:
        cls = message_class(descriptor)
        fields = [f for f in descriptor.fields if depth < DEPTH_MAX or f.type != F.TYPE_MESSAGE]

        @st.composite
        def build(draw: st.DrawFn) -> Message:
            msg = cls()
            chosen_oneofs: set[str] = set()
            for field in fields:
                oneof = field.containing_oneof
                if oneof is not None and not _synthetic(oneof) and oneof.name in chosen_oneofs:
                    continue
                if draw(st.integers(0, 3)) == 0:  # most fields set: requests get past the first checks
                    continue
                if oneof is not None and not _synthetic(oneof):
                    chosen_oneofs.add(oneof.name)
                self._set(draw, msg, field, depth)
            return msg

        return build()

    def _set(self, draw: st.DrawFn, msg: Message, field: FieldDescriptor, depth: int) -> None:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_f, value_f = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            target = getattr(msg, field.name)
            for _ in range(draw(st.integers(0, REPEATED_MAX))):
                k = draw(self.scalar(key_f))
                if value_f.type == F.TYPE_MESSAGE:
                    target[k].CopyFrom(draw(self.message(value_f.message_type, depth + 1)))
                else:
                    target[k] = draw(self.scalar(value_f))
            return
        if field.is_repeated:
            target = getattr(msg, field.name)
            for _ in range(draw(st.integers(0, REPEATED_MAX))):
                if field.type == F.TYPE_MESSAGE:
                    target.add().CopyFrom(draw(self.message(field.message_type, depth + 1)))
                else:
                    target.append(draw(self.scalar(field)))
            return
        if field.type == F.TYPE_MESSAGE:
            getattr(msg, field.name).CopyFrom(draw(self.message(field.message_type, depth + 1)))
        else:
            setattr(msg, field.name, draw(self.scalar(field)))

    def scalar(self, field: FieldDescriptor) -> st.SearchStrategy[Any]:
        t = field.type
        if t == F.TYPE_STRING:
            if "group" in field.name:
                return self.group_names
            if field.name in ("topic", "name", "source", "target", "source_topic", "target_topic"):
                return self.topic_names
            return self.names
        if t == F.TYPE_BYTES:
            return self.bytes
        if t == F.TYPE_BOOL:
            return st.booleans()
        if t in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
            return st.floats(allow_nan=True, allow_infinity=True, width=32 if t == F.TYPE_FLOAT else 64)
        if t == F.TYPE_ENUM:
            known = [v.number for v in field.enum_type.values]
            return st.one_of(st.sampled_from(known), st.integers(-3, max(known) + 3), st.just(2**31 - 1))
        low, high = _RANGES[t]
        return _weighted((3, st.sampled_from([v for v in _EDGES if low <= v <= high])), (1, st.integers(low, high)))


def _weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """``choices`` drawn with the given integer weights."""
    slots = [i for i, (weight, _) in enumerate(choices) for _ in range(weight)]
    return st.sampled_from(slots).flatmap(lambda i: choices[i][1])


def _synthetic(oneof: Any) -> bool:
    """proto3 ``optional`` fields live in a synthetic oneof of their own."""
    return len(oneof.fields) == 1 and oneof.name.startswith("_")
