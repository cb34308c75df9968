"""The results document rendered as Markdown tables and a PNG chart (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.stats import Summary, ratio

Json = dict[str, Any]
RAFTBROKER = "raftbroker"


def _summary(system: Json, workload: str, metric: str) -> Summary | None:
    data = system.get("workloads", {}).get(workload, {}).get("summary", {}).get(metric)
    return Summary.from_json(data) if data else None


def _cell(system: Json, workload: str, metric: str, fmt: Callable[[float], str]) -> str:
    """``median (min–max)``, or why there is no figure."""
    if system.get("status") != "ok":
        return "n/a"
    entry = system.get("workloads", {}).get(workload)
    if entry is None:
        return "–"
    s = _summary(system, workload, metric)
    if s is None:
        if entry.get("skipped"):
            return f"n/a ({entry['skipped']})"
        if entry.get("error") or not entry.get("summary"):
            return f"error: {entry.get('error', 'no result')}"[:80]
        return "–"  # the workload ran but this metric is newer than the document
    text = fmt(s.median) if s.n == 1 else f"{fmt(s.median)} ({fmt(s.min)}–{fmt(s.max)})"
    return text + (" ⚠" if entry.get("error") else "")


def _rate(v: float) -> str:
    return f"{v / 1000:,.1f}k" if v >= 1000 else f"{v:,.0f}"


def _ms(v: float) -> str:
    return f"{v:.2f}" if v < 10 else f"{v:,.0f}"


def _s(v: float) -> str:
    return f"{v:.2f}"


def _size_label(size: int) -> str:
    return "1 KiB" if size == 1024 else f"{size} B"


def columns(config: Json) -> list[tuple[str, str, str, Callable[[float], str], bool]]:
    """(heading, workload, metric, format, higher_is_better) of every table column."""
    cols: list[tuple[str, str, str, Callable[[float], str], bool]] = []
    for size in config["record_sizes"]:
        label = _size_label(size)
        cols.append((f"publish {label} msg/s", f"publish_{size}", "publish_msgs_per_s", _rate, True))
    for size in config["record_sizes"]:
        label = _size_label(size)
        cols.append((f"publish {label} msgs per CPU-s (servers+client)", f"publish_{size}",
                     "publish_msgs_per_cpu_s", _rate, True))
    for size in config["record_sizes"]:
        label = _size_label(size)
        cols.append((f"consume {label} msg/s", f"publish_{size}", "consume_msgs_per_s", _rate, True))
    if "queue_records" in config:  # documents from before 2026-12-06 have no work-queue workload
        label = _size_label(config["queue_size_bytes"])
        cols.append((f"work queue {label} msg/s ({config['queue_concurrency']} in flight, an ack each)", "queue",
                     "queue_msgs_per_s", _rate, True))
        cols.append((f"work queue {label} msgs per CPU-s (servers+client)", "queue", "queue_msgs_per_cpu_s",
                     _rate, True))
    rate = f"{config['latency_rate_per_s']:,.0f}/s"
    for p in ("p50", "p99", "p999"):
        cols.append((f"ack {p.replace('p999', 'p99.9')} ms @{rate}", "latency", f"ack_{p}_ms", _ms, False))
    for p in ("p50", "p99", "p999"):
        cols.append((f"e2e {p.replace('p999', 'p99.9')} ms @{rate}", "latency", f"e2e_{p}_ms", _ms, False))
    cols.append(("failover s", "failover", "failover_s", _s, False))
    cols.append(("restart s", "recovery", "restart_s", _s, False))
    return cols


def _label(system: Json) -> str:
    info = system.get("info")
    return info["key"] if info else system["name"]


def _exactly_once(system: Json) -> bool:
    return bool(system.get("info", {}).get("exactly_once"))


def _api_cells(system: Json) -> str:
    """The exactly-once and publish-API cells (``?`` for documents older than these fields)."""
    info = system.get("info", {})
    if "publish_api" not in info:
        return "? | ?"
    return f"{'yes' if info.get('exactly_once') else 'no'} | {info['publish_api']}"


def like_for_like(doc: Json) -> list[str]:
    """Which raftbroker/peer pairs compare exactly-once with exactly-once, and which do not."""
    ok = [s for s in doc["systems"] if s.get("status") == "ok"]
    ours = [s for s in ok if s["name"].startswith(RAFTBROKER) and _exactly_once(s)]
    peers = [s for s in ok if not s["name"].startswith(RAFTBROKER) and _exactly_once(s)]
    if not ours or not peers:
        return []
    others = [_label(s) for s in ok if not s["name"].startswith(RAFTBROKER) and not _exactly_once(s)]
    return ["Like-for-like exactly-once pairs (both sides drop a retried duplicate): "
            + "; ".join(f"{_label(a)} vs {_label(b)}" for a in ours for b in peers) + ". "
            + (f"The other peers ({', '.join(others)}) publish without deduplication, so raftbroker's "
               "SDK does more work per record than they do." if others else ""), ""]

def markdown(doc: Json, chart: str | None = None) -> str:
    """The results table (one row per system), the ratio table and the notes on each setup."""
    m, config = doc["machine"], doc["config"]
    cols = columns(config)
    lines = [
        f"# Peer benchmark, {doc['date']}",
        "",
        f"Machine: {m['cores']} cores ({m['cpu'] or 'unknown CPU'}), {m['memory_gib']} GiB, Python {m['python']}; "
        f"load average at start {m['load_avg_at_start']}. Everything ran on this one machine over loopback "
        f"(servers and client share the {m['cores']} cores). Each figure: median of {config['reps']} repetitions "
        "(min–max). Run took {:.0f} s. Msgs per CPU-s: records acknowledged during a publish run divided by "
        "the CPU seconds (user + system, from /proc) of every server process plus the client process over "
        "that run.".format(doc.get("duration_s", 0)),
        "",
        "| system | nodes | " + " | ".join(c[0] for c in cols) + " | exactly-once | publish API (batching) |",
        "|---|---|" + "---|" * (len(cols) + 2),
    ]
    for system in doc["systems"]:
        nodes = str(system.get("info", {}).get("nodes", "?"))
        if system.get("status") != "ok":
            reason = system.get("reason", "").replace("\n", " ").replace("|", "/")[:160]
            lines.append(f"| {_label(system)} | {nodes} | {system['status']}: {reason} |" + " |" * (len(cols) + 1))
            continue
        cells = [_cell(system, w, metric, fmt) for _, w, metric, fmt, _ in cols]
        lines.append(f"| {_label(system)} | {nodes} | " + " | ".join(cells) + f" | {_api_cells(system)} |")
    lines += ["", *like_for_like(doc), *_publish_counts(doc), "", *ratio_table(doc), ""]
    if chart:
        lines += [f"![throughput, latency, failover and restart per system]({chart})", ""]
    lines += [*_profile(doc), "## Setups", ""]
    for system in doc["systems"]:
        info = system.get("info")
        if not info:
            lines.append(f"- **{system['name']}**: {system.get('status')}: {system.get('reason', '')}")
            continue
        notes = "; ".join(info.get("notes") or [])
        dedup = f" Exactly-once: {info['exactly_once']}." if info.get("exactly_once") else ""
        lines.append(f"- **{info['key']}** ({info['version']}, {info['nodes']} node(s)): {info['guarantee']}. "
                     f"Client: {info['client']}.{dedup}{' ' + notes + '.' if notes else ''}"
                     + ("" if system.get("status") == "ok" else f" **{system['status']}**: {system.get('reason')}"))
    return "\n".join(lines) + "\n"


def _profile(doc: Json) -> list[str]:
    """The hot spots of the raftbroker leader's publish path, if a profile was taken."""
    for system in doc["systems"]:
        prof = system.get("profile")
        if not prof:
            continue
        lines = ["## Profile of the raftbroker leader (py-spy, publish of 100 B records)", "",
                 f"pid {prof.get('pid')} while it took {prof.get('publish_msgs_per_s', 0):,.0f} msgs/s under the "
                 "profiler.", ""]
        views = {"all": "every thread that is not idle", "gil": "only the thread holding the GIL"}
        for key, what in views.items():
            view = prof.get(key, prof if key == "all" and "by_self" in prof else None)
            if not view:
                continue
            if "error" in view:
                lines += [f"py-spy ({what}) failed: {view['error']}", ""]
                continue
            lines += [f"### {what} ({view['samples']} samples, `{view['folded']}`)", "",
                      "| function (by self time) | self % | incl. % |", "|---|---|---|"]
            lines += [f"| `{h['function']}` | {h['self_pct']:.1f} | {h['total_pct']:.1f} |"
                      for h in view["by_self"][:15]]
            lines += ["", "| function (by inclusive time) | self % | incl. % |", "|---|---|---|"]
            lines += [f"| `{h['function']}` | {h['self_pct']:.1f} | {h['total_pct']:.1f} |"
                      for h in view["by_total"][:20]]
            lines.append("")
        return lines
    return []


def _publish_counts(doc: Json) -> list[str]:
    """Which publish runs hit the time cap (and so published fewer records than asked)."""
    out = []
    asked = doc["config"]["publish_records"]
    for system in doc["systems"]:
        for size in doc["config"]["record_sizes"]:
            s = _summary(system, f"publish_{size}", "published")
            if s is not None and s.min < asked:
                out.append(f"- {_label(system)}, {size} B: {s.min:,.0f}–{s.max:,.0f} of {asked:,} records "
                           f"acknowledged before the {doc['config']['publish_cap_s']:g} s cap.")
            reps = system.get("workloads", {}).get(f"publish_{size}", {}).get("reps", [])
            short = [r for r in reps if r.get("consumed", 0) < r.get("published", 0)]
            if short:
                out.append(f"- {_label(system)}, {size} B: the reader got through "
                           + ", ".join(f"{r['consumed']:,.0f} of {r['published'] + 1:,.0f}" for r in short)
                           + f" records within the {doc['config']['publish_cap_s']:g} s cap.")
        queue = _summary(system, "queue", "queue_acked")
        stored = _summary(system, "queue", "queue_stored")
        if queue is not None and stored is not None and queue.min < stored.max:
            out.append(f"- {_label(system)}, work queue: {queue.min:,.0f}–{queue.max:,.0f} of {stored.max:,.0f} "
                       f"stored records acknowledged before the {doc['config']['queue_cap_s']:g} s cap.")
        if stored is not None and stored.min < doc["config"]["queue_records"]:
            out.append(f"- {_label(system)}, work queue: {stored.min:,.0f} of {doc['config']['queue_records']:,} "
                       "records stored before the fill's cap.")
        again = _summary(system, "queue", "queue_redelivered")
        if again is not None and again.max > 0:
            out.append(f"- {_label(system)}, work queue: up to {again.max:,.0f} records acknowledged twice "
                       "(delivered again after their first acknowledgement).")
        held = system.get("workloads", {}).get("recovery", {}).get("records_held")
        if held is not None and held < doc["config"]["recovery_records"]:
            out.append(f"- {_label(system)}, recovery: the node held {held:,} records "
                       f"(the fill stopped at its {doc['config']['recovery_fill_cap_s']:g} s cap).")
    return (["Capped runs:", "", *out] if out else [])


def ratio_table(doc: Json) -> list[str]:
    """raftbroker/peer ratios of the medians, per raftbroker variant and peer."""
    ours = [s for s in doc["systems"] if s["name"].startswith(RAFTBROKER) and s.get("status") == "ok"]
    peers = [s for s in doc["systems"] if not s["name"].startswith(RAFTBROKER) and s.get("status") == "ok"]
    if not ours or not peers:
        return []
    cols = columns(doc["config"])
    lines = ["## Ratios raftbroker / peer (medians of the same run)", "",
             "Throughput: > 1 means raftbroker is faster. Latency and times: < 1 means raftbroker is faster.", "",
             "| raftbroker | peer | " + " | ".join(c[0] for c in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for mine in ours:
        for peer in peers:
            cells = []
            for _, workload, metric, _, _ in cols:
                a, b = _summary(mine, workload, metric), _summary(peer, workload, metric)
                r = ratio(a.median if a else None, b.median if b else None)
                cells.append("–" if r is None else f"{r:.2f}×")
            pair = " (like-for-like exactly-once)" if _exactly_once(mine) and _exactly_once(peer) else ""
            lines.append(f"| {_label(mine)} | {_label(peer)}{pair} | " + " | ".join(cells) + " |")
    return lines


def chart(doc: Json, path: Path) -> None:
    """Seven panels (publish, consume, work queue, ack latency, e2e latency, failover, restart) with min–max
    error bars (no work-queue panel for documents from before that workload)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [s for s in doc["systems"] if s.get("status") == "ok"]
    labels = [_label(s) for s in systems]
    sizes = doc["config"]["record_sizes"]
    fig, grid = plt.subplots(2, 4, figsize=(24, 10))
    axes = [list(row) for row in grid]
    size_labels = [_size_label(z) for z in sizes]
    by_size = list(zip(sizes, size_labels, strict=True))
    _bars(axes[0][0], systems, labels, [(f"publish_{z}", "publish_msgs_per_s", lab) for z, lab in by_size],
          "acknowledged publish, msgs/s (log)", log=True)
    _bars(axes[0][1], systems, labels, [(f"publish_{z}", "consume_msgs_per_s", lab) for z, lab in by_size],
          "consume stored records, msgs/s (log)", log=True)
    pcts = [("p50", "p50"), ("p99", "p99"), ("p999", "p99.9")]
    rate = f"{doc['config']['latency_rate_per_s']:,.0f}/s"
    _bars(axes[0][2], systems, labels, [("latency", f"ack_{p}_ms", lab) for p, lab in pcts],
          f"publish→ack latency at {rate}, ms (log)", log=True)
    _bars(axes[1][0], systems, labels, [("latency", f"e2e_{p}_ms", lab) for p, lab in pcts],
          f"publish→delivery latency at {rate}, ms (log)", log=True)
    _bars(axes[1][1], systems, labels, [("failover", "failover_s", "kill -9 leader → publishes succeed")],
          "failover, s")
    _bars(axes[1][2], systems, labels, [("recovery", "restart_s", "restart → holds its records")],
          "node restart with its records, s")
    if "queue_records" in doc["config"]:
        _bars(axes[0][3], systems, labels, [("queue", "queue_msgs_per_s",
                                             f"{doc['config']['queue_concurrency']} in flight, an ack each")],
              "work queue drained, msgs/s (log)", log=True)
    else:
        axes[0][3].set_visible(False)
    axes[1][3].set_visible(False)
    absent = [f"{_label(s)}: {s['status']}" for s in doc["systems"] if s.get("status") != "ok"]
    if absent:
        fig.text(0.01, 0.005, "Not shown: " + "; ".join(absent)[:220], fontsize=8)
    m = doc["machine"]
    fig.suptitle(f"raftbroker vs peers, {doc['date'][:10]}: {m['cores']} cores, loopback, Python clients; "
                 f"median of {doc['config']['reps']} (bars: min–max)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _bars(ax: Any, systems: Sequence[Json], labels: Sequence[str], series: Sequence[tuple[str, str, str]],
          title: str, log: bool = False) -> None:
    width = 0.8 / max(1, len(series))
    for k, (workload, metric, label) in enumerate(series):
        xs, meds, lo, hi = [], [], [], []
        for i, system in enumerate(systems):
            s = _summary(system, workload, metric)
            if s is None:
                continue
            xs.append(i + (k - (len(series) - 1) / 2) * width)
            meds.append(s.median)
            lo.append(s.median - s.min)
            hi.append(s.max - s.median)
        if xs:
            ax.bar(xs, meds, width, yerr=[lo, hi], capsize=3, label=label)
    ax.set_xticks(range(len(systems)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_title(title, fontsize=10)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8)
