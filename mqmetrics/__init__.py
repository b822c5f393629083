"""Prometheus metrics building blocks shared by the broker and the NameServer (issue #22).

This package imports nothing of the project (like `mqcli` and `mqsecurity`), so every process
uses the same copy; `docs/METRICS.md` lists every metric.

- `mqmetrics.hot`: what the hot paths touch: `Histogram` (a bisect and two additions per
  observation, no lock: one thread writes) and `LabelCounters` (per-label counts in a dict of
  bounded size, the overflow counted under `OTHER`).
- `mqmetrics.families`: turning those and plain numbers into `prometheus_client` families at
  scrape time, and `capped`, which bounds the series one family may export.
- `mqmetrics.server`: the read-only HTTP endpoint (`/metrics` only, GET only, a bounded number
  of connections, each with a read timeout) and `LoopCollector`, which builds the families on
  the process's event loop, so nothing is read while the loop changes it.
"""
