"""Disk faults on one node's store files: flipped bytes and truncation, applied while the node is
down (kill -9), then the node is restarted and watched.

Modes: ``flip-sst`` (bytes of a RocksDB table file), ``truncate-wal`` (the newest RocksDB WAL),
``flip-journal`` / ``truncate-journal`` (a segment of the Raft journal), ``flip-snapshot`` (the Raft snapshot
file). A mode whose file does not exist on the node falls back to the next in that order.

What the node does is recorded: it refuses to start, or it starts and catches up, and a scrub
(a full read of its partitions) finds damage it signals (``badmsg`` events, read errors) or not.
Detected damage is repaired the way an operator would (docs/drills.md): stop the node, wipe its
data, start it empty so that it is caught up from the leader. Damage the node does not signal is
left alone: if it changed what the node serves, the final read shows the replicas disagreeing.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

from broker.replication.journal import JOURNAL_DIR_NAME, SEGMENT_SUFFIX
from chaos.nemeses import RECOVERY_TIMEOUT_S, Ctx, Step
from chaos.reads import read_partition

MODES = ("flip-sst", "truncate-wal", "flip-journal", "truncate-journal", "flip-snapshot")
START_WATCH_S = 5.0


def _files(node_dir: Path, mode: str) -> list[Path]:
    if mode == "flip-sst":
        found = sorted((node_dir / "store").rglob("*.sst"))
    elif mode == "truncate-wal":
        found = sorted((node_dir / "store").rglob("*.log"), key=lambda p: p.stat().st_mtime)[-1:]
    elif mode in ("flip-journal", "truncate-journal"):
        found = sorted((node_dir / "raft" / JOURNAL_DIR_NAME).glob("*" + SEGMENT_SUFFIX))
    else:
        found = sorted((node_dir / "raft").glob("raft.snapshot"))
    return [p for p in found if p.is_file() and p.stat().st_size > 0]


def damage(node_dir: Path, mode: str, rng: random.Random, flips: int) -> tuple[str, Path, str] | None:
    """Apply ``mode`` (or the next mode that has a file); return (mode used, file, what was done)."""
    start = MODES.index(mode)
    for used in MODES[start:] + MODES[:start]:
        files = _files(node_dir, used)
        if not files:
            continue
        path = files[rng.randrange(len(files))]
        size = path.stat().st_size
        if used.startswith("truncate"):
            keep = rng.randrange(size)
            with open(path, "r+b") as f:
                f.truncate(keep)
            return used, path, f"truncated {size} -> {keep} bytes"
        offsets = sorted(rng.randrange(size) for _ in range(flips))
        with open(path, "r+b") as f:
            for off in offsets:
                f.seek(off)
                byte = f.read(1)
                f.seek(off)
                f.write(bytes([byte[0] ^ (1 << rng.randrange(8))]))
        return used, path, f"flipped a bit at offsets {offsets} of {size} bytes"
    return None


def corrupt(ctx: Ctx, step: Step) -> None:
    """Damage a stopped node's files; restart it; detect, and repair what is detected."""
    target = ctx.leader() if step.params.get("target") == "leader" else ctx.follower(int(step.params.get("k", 0)))
    fid = ctx.fault("corrupt", [target], mode=step.params["mode"])
    try:
        ctx.cluster.kill(target)
        node_dir = ctx.cluster.node_data_dir(target)
        done = damage(node_dir, str(step.params["mode"]), random.Random(int(step.params["salt"])),
                      int(step.params.get("flips", 4)))
        if done is None:
            ctx.note(fid, damaged="nothing: no store file found")
        else:
            ctx.note(fid, mode_used=done[0], file=str(done[1].relative_to(node_dir)), action=done[2])
        ctx.hold(float(step.params.get("down_s", 0.5)))
        ctx.cluster.spawn(target)
        verdict = _watch(ctx, target)
        ctx.note(fid, verdict=verdict)
        if verdict != "rejoined, scrub clean":
            _rebuild(ctx, fid, target)
    finally:
        if not ctx.cluster.alive(target):
            ctx.cluster.spawn(target)
        ctx.heal(fid, "corrupt")


def _watch(ctx: Ctx, i: int) -> str:
    """What the restarted node does: exits, never catches up, or catches up (then scrubbed)."""
    deadline = time.monotonic() + START_WATCH_S
    while time.monotonic() < deadline:
        proc = ctx.cluster.procs[i]
        if proc is not None and proc.poll() is not None:
            return f"refused to start (exit code {proc.returncode}): {_last_line(ctx, i)}"
        if ctx.cluster.view(i) is not None:
            break
        time.sleep(0.1)
    leader = ctx.leader()
    lv = ctx.cluster.view(leader)
    if lv is None or not ctx.cluster.wait_caught_up(i, lv.commit_index, RECOVERY_TIMEOUT_S):
        proc = ctx.cluster.procs[i]
        if proc is not None and proc.poll() is not None:
            return f"exited (code {proc.returncode}): {_last_line(ctx, i)}"
        return "did not catch up"
    for topic, partitions in ctx.topics.items():
        for p in range(partitions):
            read = read_partition(ctx.cluster.grpc_address(i), topic, p)
            if read.signalled_damage:
                bad = read.error or next(e for e in read.events if e["event"] == "badmsg")
                return f"scrub found damage in {topic}/{p}: {bad}"
    return "rejoined, scrub clean"


def _rebuild(ctx: Ctx, fid: int, i: int) -> None:
    """The operator's repair: stop the node, wipe its data, start it empty; it catches up."""
    ctx.cluster.kill(i)
    shutil.rmtree(ctx.cluster.node_data_dir(i), ignore_errors=True)
    ctx.cluster.spawn(i)
    leader = ctx.leader()
    lv = ctx.cluster.view(leader)
    caught_up = lv is not None and ctx.cluster.wait_caught_up(i, lv.commit_index, RECOVERY_TIMEOUT_S)
    ctx.note(fid, repaired="wiped and rebuilt from the leader", caught_up=caught_up)


def _last_line(ctx: Ctx, i: int) -> str:
    try:
        lines = [ln for ln in ctx.cluster.log_path(i).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "?"
    return lines[-1][-200:] if lines else "?"
