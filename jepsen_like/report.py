"""The run directory's report: verdict table, ``results.json``, PNG plots and ``index.html``."""

from __future__ import annotations

import html
import json
import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jepsen_like.checker import CheckResult
from jepsen_like.history import NEMESIS, Op, pairs

logger = logging.getLogger(__name__)

# Width of one throughput bin, seconds.
THROUGHPUT_BIN_S = 1.0
# Colours of fault windows in the plots (any other kind is grey).
FAULT_COLOURS = {
    "partition": "#e41a1c",
    "kill": "#377eb8",
    "pause": "#4daf4a",
    "disk": "#984ea3",
    "latency": "#ff7f00",
    "bandwidth": "#a65628",
    "rolling": "#f781bf",
    "storage": "#999900",
}
OUTCOME_COLOURS = {"ok": "#1b9e77", "info": "#d95f02", "fail": "#e7298a"}
WRITE_FS = ("send", "append")


def verdict_table(results: Sequence[CheckResult]) -> str:
    rows = [("CHECK", "VERDICT", "COUNT", "SUMMARY")]
    rows += [(r.name, "PASS" if r.valid else "FAIL", str(r.count), r.summary) for r in results]
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{a:<{w[0]}}  {b:<{w[1]}}  {c:>{w[2]}}  {d}" for a, b, c, d in rows]
    ok = all(r.valid for r in results)
    lines.append(f"verdict: {'PASS' if ok else 'FAIL'}")
    return "\n".join(lines)


def op_counts(ops: Sequence[Op]) -> dict[str, dict[str, int]]:
    counts: dict[str, Counter[str]] = {}
    for op in ops:
        if op.type != "invoke":
            counts.setdefault(op.f, Counter())[op.type] += 1
    return {f: dict(c) for f, c in sorted(counts.items())}


def fault_windows(ops: Sequence[Op], end_s: float) -> list[tuple[str, float, float, str]]:
    """(kind, start, end, detail) from the nemesis records (a window left open ends at
    ``end_s``)."""
    open_: dict[str, tuple[float, str]] = {}
    out: list[tuple[str, float, float, str]] = []
    for op in ops:
        if op.process != NEMESIS:
            continue
        kind = str(op.value.get("fault", "?"))
        if op.f == "start":
            open_[kind] = (op.time, str(op.value.get("detail", "")))
        elif op.f == "stop" and kind in open_:
            start, detail = open_.pop(kind)
            out.append((kind, start, op.time, detail))
    out += [(k, s, end_s, d) for k, (s, d) in open_.items()]
    return sorted(out, key=lambda w: w[1])


def plot(ops: Sequence[Op], out_dir: Path) -> list[str]:
    """latency.png and throughput.png; returns the file names written ([] without
    matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        logger.warning("matplotlib is not installed: no plots")
        return []
    writes = [(inv, done) for inv, done in pairs(ops) if inv.f in WRITE_FS and done is not None]
    end_s = max((op.time for op in ops), default=1.0)
    windows = fault_windows(ops, end_s)

    def shade(ax: Any) -> None:
        kinds = []
        for kind, start, end, _ in windows:
            ax.axvspan(start, end, color=FAULT_COLOURS.get(kind, "#999999"), alpha=0.15, lw=0)
            kinds.append(kind)
        return None

    def legend(ax: Any) -> None:
        handles, labels = ax.get_legend_handles_labels()
        for kind in sorted({w[0] for w in windows}):
            handles.append(Patch(color=FAULT_COLOURS.get(kind, "#999999"), alpha=0.3))
            labels.append(kind)
        if handles:
            ax.legend(handles, labels, loc="upper right", fontsize="small")

    written = []
    fig, ax = plt.subplots(figsize=(11, 4.5))
    shade(ax)
    for outcome, colour in OUTCOME_COLOURS.items():
        pts = [
            (i.time, max(0.01, (d.time - i.time) * 1000)) for i, d in writes if d.type == outcome
        ]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.scatter(xs, ys, s=3, color=colour, label=f"{outcome} ({len(pts)})")
    ax.set_yscale("log")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("write latency (ms)")
    ax.set_title("write latency, fault windows shaded")
    ax.set_xlim(0, end_s)
    legend(ax)
    fig.tight_layout()
    fig.savefig(out_dir / "latency.png", dpi=100)
    plt.close(fig)
    written.append("latency.png")

    fig, ax = plt.subplots(figsize=(11, 4))
    shade(ax)
    bins = int(end_s / THROUGHPUT_BIN_S) + 1
    bin_xs = [i * THROUGHPUT_BIN_S for i in range(bins)]
    for outcome, colour in OUTCOME_COLOURS.items():
        counts = [0] * bins
        for _inv, d in writes:
            if d.type == outcome:
                counts[min(bins - 1, int(d.time / THROUGHPUT_BIN_S))] += 1
        if any(counts):
            ax.plot(bin_xs, [c / THROUGHPUT_BIN_S for c in counts], color=colour, label=outcome)
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("writes completed per second")
    ax.set_title("throughput, fault windows shaded")
    ax.set_xlim(0, end_s)
    legend(ax)
    fig.tight_layout()
    fig.savefig(out_dir / "throughput.png", dpi=100)
    plt.close(fig)
    written.append("throughput.png")
    return written


def write_html(out_dir: Path, results: dict[str, Any], plots: Sequence[str]) -> None:
    e = html.escape
    ok = bool(results["valid"])
    rows = "".join(
        f"<tr class={'pass' if c['valid'] else 'fail'}><td>{e(c['name'])}</td>"
        f"<td>{'PASS' if c['valid'] else 'FAIL'}</td><td>{c['count']}</td>"
        f"<td>{e(c['summary'])}</td></tr>"
        for c in results["checks"]
    )
    faults = "".join(
        f"<tr><td>{w['kind']}</td><td>{w['start_s']:.1f}</td><td>{w['end_s']:.1f}</td>"
        f"<td>{e(w['detail'])}</td></tr>"
        for w in results["faults"]
    )
    counts = "".join(
        f"<tr><td>{e(f)}</td><td>{c.get('ok', 0)}</td><td>{c.get('info', 0)}</td>"
        f"<td>{c.get('fail', 0)}</td></tr>"
        for f, c in results["op_counts"].items()
    )
    examples = "".join(
        f"<h3>{e(c['name'])}</h3><pre>{e(json.dumps(c['examples'], indent=1)[:4000])}</pre>"
        for c in results["checks"]
        if c["examples"]
    )
    events = "".join(f"<li>{e(x)}</li>" for x in results.get("events", []))
    imgs = "".join(f'<p><img src="{e(p)}" alt="{e(p)}" width="100%"></p>' for p in plots)
    cfg = e(json.dumps(results["config"]))
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>mqjepsen run: {"PASS" if ok else "FAIL"}</title>
<style>
body {{ font-family: sans-serif; max-width: 1100px; margin: 1em auto; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 2px 8px; }}
tr.pass td:nth-child(2) {{ color: #1b7e1b; font-weight: bold; }}
tr.fail td:nth-child(2) {{ color: #c00; font-weight: bold; }}
.verdict {{ font-size: 2em; color: {"#1b7e1b" if ok else "#c00"}; }}
</style></head><body>
<h1>mqjepsen run <span class="verdict">{"PASS" if ok else "FAIL"}</span></h1>
<p><code>{cfg}</code></p>
<h2>Checkers</h2>
<table><tr><th>check</th><th>verdict</th><th>count</th><th>summary</th></tr>{rows}</table>
<h2>Operations</h2>
<table><tr><th>f</th><th>ok</th><th>info (unknown)</th><th>fail</th></tr>{counts}</table>
<h2>Plots</h2>{imgs or "<p>(matplotlib not installed: no plots)</p>"}
<h2>Faults</h2>
<table><tr><th>fault</th><th>start s</th><th>end s</th><th>detail</th></tr>{faults}</table>
<ul>{events}</ul>
<h2>Examples of problems</h2>{examples or "<p>none</p>"}
<p>Files: <a href="history.jsonl">history.jsonl</a>, <a href="results.json">results.json</a>,
<a href="final-state.json">final-state.json</a>, node logs in <code>cluster/</code>.</p>
</body></html>
"""
    (out_dir / "index.html").write_text(page, encoding="utf-8")
