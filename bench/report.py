"""``mqbench`` results as ratios to the peers and targets, a Markdown report and a PNG chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Issue #10's targets (same-run ratios; the absolute figures drift between runs).
SYNC_VS_ETCD_TARGET = 3.0
ASYNC_VS_NATS_TARGET = 2.0
FAILOVER_MEDIAN_TARGET_S = 2.0
CATCH_UP_TARGET_MB_S = 100.0
DELAY_RETRY_TARGET_RATIO = 0.25
# Issue #22: serving (and being scraped for) metrics costs at most 2% of the send rate.
METRICS_COST_TARGET_RATIO = 0.98
REFERENCE_SIZE = 1024
REFERENCE_IN_FLIGHT = 256


def _case(result: dict[str, Any], flush: str) -> dict[str, Any] | None:
    for c in result.get("produce", []):
        if (
            c["flush"] == flush
            and c["message_bytes"] == REFERENCE_SIZE
            and c["in_flight"] == REFERENCE_IN_FLIGHT
        ):
            return dict(c)
    return None


def _peer(result: dict[str, Any], name: str) -> dict[str, Any] | None:
    p = result.get("peers", {}).get(name)
    if isinstance(p, dict) and "ops_per_s" in p:
        return dict(p)
    return None


def ratios(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target: what was measured, the target, and whether it was met (None when a
    side of the comparison was not measured in this run)."""
    rows: list[dict[str, Any]] = []
    sync, asyn = _case(result, "SYNC_FLUSH"), _case(result, "ASYNC_FLUSH")
    etcd, nats = _peer(result, "etcd"), _peer(result, "nats_jetstream_r3")

    def row(name: str, value: float | None, target: str, met: bool | None) -> None:
        rows.append({"figure": name, "value": value, "target": target, "met": met})

    if sync and etcd:
        r = sync["messages_per_s"] / etcd["ops_per_s"]
        row("SYNC_FLUSH msg/s / etcd puts/s (1 KiB, 256)", r, ">= 3", r >= SYNC_VS_ETCD_TARGET)
        row(
            "SYNC_FLUSH p99 / etcd p99 (ms)",
            sync["p99_ms"] / etcd["p99_ms"] if etcd["p99_ms"] else None,
            "<= 1",
            sync["p99_ms"] <= etcd["p99_ms"],
        )
    else:
        row("SYNC_FLUSH msg/s / etcd puts/s (1 KiB, 256)", None, ">= 3", None)
    if asyn and nats:
        r = asyn["messages_per_s"] / nats["ops_per_s"]
        row("ASYNC_FLUSH msg/s / NATS JetStream R3 (1 KiB, 256)", r, ">= 2", r >= 2.0)
    else:
        row("ASYNC_FLUSH msg/s / NATS JetStream R3 (1 KiB, 256)", None, ">= 2", None)
    fo = result.get("failover", {}).get("median_s")
    row("failover median (s)", fo, "< 2", None if fo is None else fo < FAILOVER_MEDIAN_TARGET_S)
    bl = result.get("backlog", {}).get("read_mb_per_s")
    row("catch-up read (MB/s)", bl, "> 100", None if bl is None else bl > CATCH_UP_TARGET_MB_S)
    dr = result.get("delay_retry", {})
    for key, name in (("delay_ratio", "delayed msg/s / send msg/s"), ("retry_ratio", "retries")):
        v = dr.get(key)
        row(name, v, ">= 0.25", None if v is None else v >= DELAY_RETRY_TARGET_RATIO)
    ratios_on_off = [
        x["on_over_off"]
        for x in (result.get("metrics") or {}).get("summary", [])
        if x["on_over_off"] is not None
    ]
    worst = min(ratios_on_off) if ratios_on_off else None
    row(
        "metrics on / off msg/s (worst in-flight count)",
        worst,
        ">= 0.98",
        None if worst is None else worst >= METRICS_COST_TARGET_RATIO,
    )
    return rows


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def _on_off_lines(what: str, sec: dict[str, Any] | None) -> list[str]:
    """An on/off comparison (security: issue #18, metrics: #22), one line per in-flight count."""
    if not sec:
        return []
    return [
        f"- {what} on / off ({sec['flush']}, {sec['message_bytes']} B, median of "
        f"{sec['rounds']} rounds, same run), {s['in_flight']} in flight: "
        f"{_fmt(s['on_messages_per_s'])} / {_fmt(s['off_messages_per_s'])} msg/s = "
        f"{_fmt(s['on_over_off'])} (each round: on "
        f"{', '.join(_fmt(v) for v in s['on_each_round'])}; off "
        f"{', '.join(_fmt(v) for v in s['off_each_round'])})"
        for s in sec["summary"]
    ]


def _v2_lines(result: dict[str, Any]) -> list[str]:
    """The v2 producer cases (issue #19) beside the raftmq client's case of the same group,
    size and in-flight count (``-`` when the run had no such case)."""
    v2 = result.get("produce_v2")
    if not v2:
        return []
    lines = ["", "## v2 producer (official RocketMQ 5 Python client, same group, same run)", ""]
    skipped = [c["skipped"] for c in v2 if "skipped" in c]
    if skipped:
        return [*lines, f"- skipped: {skipped[0]}"]
    lines += [
        "| client | flush | size B | in flight | msg/s | p50 ms | p99 ms | failed "
        "| raftmq client msg/s | p50 ms | p99 ms | v2 / raftmq |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in v2:
        ours = next(
            (
                o
                for o in result.get("produce", [])
                if (o["flush"], o["message_bytes"], o["in_flight"])
                == (c["flush"], c["message_bytes"], c["in_flight"])
            ),
            None,
        )
        ratio = (
            c["messages_per_s"] / ours["messages_per_s"]
            if ours and ours["messages_per_s"]
            else None
        )
        lines.append(
            f"| {c['client']} | {c['flush']} | {c['message_bytes']} | {c['in_flight']} | "
            f"{_fmt(c['messages_per_s'])} | {_fmt(c['p50_ms'])} | {_fmt(c['p99_ms'])} | "
            f"{c['failed']} | {_fmt(ours['messages_per_s'] if ours else None)} | "
            f"{_fmt(ours['p50_ms'] if ours else None)} | {_fmt(ours['p99_ms'] if ours else None)} "
            f"| {_fmt(ratio)} |"
        )
    return lines


def write_markdown(result: dict[str, Any], path: Path) -> str:
    lines = [
        f"# mqbench {result['started_utc']}{' (smoke)' if result.get('smoke') else ''}",
        "",
        result["conditions"] + ".",
        f"Host: {result['host']['cpus']} CPUs, Python {result['host']['python']}, load average "
        f"at start {', '.join(f'{x:.1f}' for x in result['host']['load_avg_at_start'])}.",
        "",
        "## Targets",
        "",
        "| figure | value | target | met |",
        "| --- | ---: | --- | --- |",
    ]
    for r in result.get("ratios", []):
        met = {True: "yes", False: "**no**", None: "not measured"}[r["met"]]
        lines.append(f"| {r['figure']} | {_fmt(r['value'])} | {r['target']} | {met} |")
    lines += [
        "",
        "## Produce",
        "",
        "| flush | size B | in flight | msg/s | MB/s | p50 ms | p99 ms | p99.9 ms | failed "
        "| CPU s per 1M msgs (n0/n1/n2) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for c in result.get("produce", []):
        cpu = "/".join(f"{v:.0f}" for v in c["cpu_s_per_million_msgs"].values())
        lines.append(
            f"| {c['flush']} | {c['message_bytes']} | {c['in_flight']} | "
            f"{_fmt(c['messages_per_s'])} | {_fmt(c['mb_per_s'])} | {_fmt(c['p50_ms'])} | "
            f"{_fmt(c['p99_ms'])} | {_fmt(c['p999_ms'])} | {c['failed']} | {cpu} |"
        )
    lines += _v2_lines(result)
    peers = result.get("peers", {})
    lines += ["", "## Peers (1 KiB, 256 in flight, same run)", ""]
    for name, p in peers.items() if isinstance(peers, dict) else []:
        if isinstance(p, dict) and "ops_per_s" in p:
            lines.append(
                f"- {name}: {_fmt(p['ops_per_s'])} ops/s, p50 {_fmt(p['p50_ms'])} ms, p99 "
                f"{_fmt(p['p99_ms'])} ms ({p.get('conditions', '')})"
            )
        else:
            lines.append(f"- {name}: {p.get('skipped', p) if isinstance(p, dict) else p}")
    e2e, bl, fo = result.get("e2e"), result.get("backlog"), result.get("failover")
    lines += ["", "## Other figures", ""]
    if e2e:
        lines.append(
            f"- end to end (send -> push consumer callback) at {e2e['rate_per_s']} msg/s: p50 "
            f"{_fmt(e2e['p50_ms'])} ms, p99 {_fmt(e2e['p99_ms'])} ms, p99.9 "
            f"{_fmt(e2e['p999_ms'])} ms ({e2e['received']}/{e2e['sent']} received)"
        )
    if bl:
        lines.append(
            f"- backlog of {bl['messages']:,} x 1 KiB: filled at {_fmt(bl['fill_messages_per_s'])}"
            f" msg/s; read back at {_fmt(bl['read_messages_per_s'])} msg/s = "
            f"{_fmt(bl['read_mb_per_s'])} MB/s"
        )
    if fo:
        secs = ", ".join(f"{s:.2f}" for s in fo["seconds"])
        lines.append(
            f"- failover (SIGKILL leader -> next ack), {fo['trials']} trials: median "
            f"{_fmt(fo['median_s'])} s, max {_fmt(fo['max_s'])} s ({secs})"
        )
    dr = result.get("delay_retry")
    if dr:
        lines.append(
            f"- delayed messages {_fmt(dr['delayed']['messages_per_s'])} msg/s, retries "
            f"{_fmt(dr['retries']['messages_per_s'])} msg/s (ratios to the best send rate "
            f"{_fmt(dr['send_rate_for_ratio'])}: {_fmt(dr['delay_ratio'])}, "
            f"{_fmt(dr['retry_ratio'])})"
        )
    lines += _on_off_lines("security", result.get("security"))
    lines += _on_off_lines("metrics", result.get("metrics"))
    for flush, rss in result.get("peak_rss_mb", {}).items():
        lines.append(
            f"- peak RSS per node, {flush}: " + ", ".join(f"{k} {v:.0f} MB" for k, v in rss.items())
        )
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def _chart_series(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Bar series for the chart: name -> {case label -> msg/s}; the raftmq client under each
    flush mode, and the v2 producer's cases (their flush mode named) when measured."""
    series: dict[str, dict[str, float]] = {}
    for flush in ("SYNC_FLUSH", "ASYNC_FLUSH"):
        series[flush] = {
            f"{c['message_bytes']}B x{c['in_flight']}": c["messages_per_s"]
            for c in result.get("produce", [])
            if c["flush"] == flush
        }
    v2 = [c for c in result.get("produce_v2", []) if "messages_per_s" in c]
    if v2:
        series[f"v2 Python client ({v2[0]['flush']})"] = {
            f"{c['message_bytes']}B x{c['in_flight']}": c["messages_per_s"] for c in v2
        }
    return series


def write_chart(result: dict[str, Any], path: Path) -> None:
    """Messages/s per produce case (both flush modes, and the v2 producer's cases), with the
    peers as reference lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = _chart_series(result)
    labels: list[str] = []
    for values in series.values():
        labels += [label for label in values if label not in labels]
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / len(series)
    for k, (name, values) in enumerate(series.items()):
        xs = [labels.index(label) + (k - (len(series) - 1) / 2) * width for label in values]
        ax.bar(xs, list(values.values()), width, label=name)
    colors = {"etcd": "tab:red", "nats_jetstream_r3": "tab:green"}
    for name, p in (result.get("peers") or {}).items():
        if isinstance(p, dict) and "ops_per_s" in p:
            ax.axhline(p["ops_per_s"], linestyle="--", color=colors.get(name, "gray"), label=name)
    ax.set_xticks(range(len(labels)), labels, rotation=30)
    ax.set_ylabel("messages / s")
    ax.set_title("raftmq produce throughput, 3 nodes on 127.0.0.1 (peers: 1 KiB, 256 in flight)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
