"""Pipeline declarations: ``topic("a").pipe(fn).to(topic("b"))`` and DAGs of such stages.

A :class:`Stage` reads one topic, maps each record through ``fn`` and writes what ``fn`` returns
to one topic. ``fn`` receives a :class:`broker.client.Record`, or for a source declared with a
Pydantic ``model`` the record's value parsed into that model, and returns nothing (``None``),
one output, or a list/tuple/generator of outputs. An output is a Pydantic model (written as its
JSON), a ``dict`` (written as JSON), ``bytes``/``str`` (the value), or an
:class:`broker.client.OutgoingRecord` (value, key, partition, headers). An output without key or
partition keeps the source record's key, or else goes to the source record's partition (modulo
the target's partition count), so order per source partition is kept.

A :class:`Pipeline` is a set of stages forming a DAG over topics (fan-out: several stages read
one topic; fan-in: several write one). Declaring needs no Spark; running does
(:mod:`broker.pipeline.runner`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

STAGE_NAME_CHARS_MAX = 120
_NAME_OK = re.compile(r"[A-Za-z0-9._-]+")


@dataclass(frozen=True)
class TopicRef:
    """A topic of the cluster a pipeline runs against; ``model``: its Pydantic type, if typed."""

    name: str
    model: type[BaseModel] | None = None

    def __post_init__(self) -> None:
        if not self.name or not _NAME_OK.fullmatch(self.name):
            raise ValueError(f"topic name must be letters, digits, '.', '_' or '-', got {self.name!r}")

    def pipe(self, fn: Callable[[Any], Any], *, name: str | None = None) -> Piped:
        """Map this topic's records through ``fn``; finish with :meth:`Piped.to`."""
        if not callable(fn):
            raise TypeError(f"pipe() needs a callable, got {type(fn).__name__}")
        return Piped(self, fn, name or str(getattr(fn, "__name__", "fn")))


def topic(name: str, model: type[BaseModel] | None = None) -> TopicRef:
    """Refer to topic ``name`` (typed by ``model`` when given)."""
    return TopicRef(name, model)


@dataclass(frozen=True)
class Piped:
    """A source and a function, waiting for its target."""

    source: TopicRef
    fn: Callable[[Any], Any]
    label: str

    def to(self, target: TopicRef | str) -> Stage:
        """The stage that writes ``fn``'s outputs to ``target``."""
        return Stage(self.source, self.fn, target if isinstance(target, TopicRef) else TopicRef(target), self.label)


@dataclass(frozen=True)
class Stage:
    """One edge of a pipeline: ``source`` -> ``fn`` -> ``target``; one streaming query."""

    source: TopicRef
    fn: Callable[[Any], Any]
    target: TopicRef
    label: str

    @property
    def name(self) -> str:
        """Unique within a pipeline: names the query and its checkpoint directory."""
        raw = f"{self.source.name}--{self.label}--{self.target.name}"
        return re.sub(r"[^A-Za-z0-9._-]", "_", raw)[:STAGE_NAME_CHARS_MAX]

    def run(self, **options: Any) -> Any:
        """Run a pipeline of this one stage (see :meth:`Pipeline.run`)."""
        return Pipeline([self]).run(**options)


class Pipeline:
    """Stages forming a DAG over topics. ``name`` scopes the default checkpoint directory."""

    def __init__(self, stages: Iterable[Stage], *, name: str = "pipeline") -> None:
        self.stages: list[Stage] = list(stages)
        self.name = name
        if not self.stages:
            raise ValueError("a pipeline needs at least one stage")
        for stage in self.stages:
            if not isinstance(stage, Stage):
                raise TypeError(f"a pipeline holds stages (source.pipe(fn).to(target)), got {type(stage).__name__}")
        names = [s.name for s in self.stages]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"stages must differ; repeated: {', '.join(duplicates)} (give pipe(fn, name=...))")
        self.order()  # refuses cycles now, not when run

    def order(self) -> list[Stage]:
        """Stages in dependency order: a stage comes after every stage writing its source.
        Raises ``ValueError`` on a cycle (a caught-up run would never end)."""
        done: list[Stage] = []
        pending = list(self.stages)
        while pending:
            written_later = {s.target.name for s in pending}
            ready = [s for s in pending if s.source.name not in written_later]
            if not ready:
                cycle = ", ".join(s.name for s in pending)
                raise ValueError(f"the pipeline has a cycle among: {cycle}")
            done.extend(ready)
            pending = [s for s in pending if s not in ready]
        return done

    def topics(self) -> list[TopicRef]:
        """Every topic the pipeline reads or writes, in first-seen order."""
        seen: dict[str, TopicRef] = {}
        for stage in self.stages:
            for ref in (stage.source, stage.target):
                seen.setdefault(ref.name, ref)
        return list(seen.values())

    def mermaid(self) -> str:
        """The DAG as a Mermaid flowchart (topics as nodes, stages as labelled edges)."""
        ids = {ref.name: f"t{i}" for i, ref in enumerate(self.topics())}
        lines = ["flowchart LR"]
        lines += [f'  {ids[ref.name]}[("{ref.name}")]' for ref in self.topics()]
        lines += [f'  {ids[s.source.name]} -->|"{s.label}"| {ids[s.target.name]}' for s in self.stages]
        return "\n".join(lines) + "\n"

    def run(self, **options: Any) -> Any:
        """Run every stage as a Spark Structured Streaming query; see
        :func:`broker.pipeline.runner.run` for the options (bootstrap, until, master, checkpoint,
        dry_run, on_progress)."""
        from broker.pipeline.runner import run

        return run(self, **options)


def as_pipeline(target: Pipeline | Stage | Sequence[Stage]) -> Pipeline:
    """A pipeline from a pipeline, one stage or a list of stages (what ``module:attr`` may name)."""
    if isinstance(target, Pipeline):
        return target
    if isinstance(target, Stage):
        return Pipeline([target])
    if isinstance(target, list | tuple):
        return Pipeline(target)
    raise TypeError(f"expected a Pipeline, a Stage or a list of stages, got {type(target).__name__}")
