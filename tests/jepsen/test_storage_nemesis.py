"""The storage nemesis's schedule, on real store files and a stand-in for the group (no
processes): five windows deal one fault of each kind, all on the same one node of three, each
recorded with what it did; a damaged node that would not start is a ``refused`` record that
fails ``repaired``; a rollback forgets what the node acknowledged after its copy and leaves
the promise file alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger.log import Entry, HardState
from dledger.storage import codec
from dledger.storage.store import SegmentedLogStore, StoreConfig
from jepsen_like import disk
from jepsen_like.checker import check_repaired
from jepsen_like.history import NEMESIS, History
from jepsen_like.nemesis import STORAGE_FAULTS, Nemesis, parse_storage_faults
from jepsen_like.workloads import TOPIC

CFG = StoreConfig(segment_size_bytes=64 * 1024, index_segment_size_bytes=64 * 1024)
ENTRIES = 2000
GROWTH = 150  # entries the stand-in node acknowledges while its copy waits


class FakeCluster:
    """What the storage nemesis asks of :class:`JepsenCluster`, over real store files."""

    def __init__(self, base: Path, refuse: bool = False) -> None:
        self.base = base / "cluster"
        self.ids = ["n0", "n1", "n2"]
        self.events: list[str] = []
        self.actions: list[str] = []
        self.refuse = refuse
        for nid in self.ids:
            self._make(nid)

    def _make(self, nid: str) -> None:
        d = self.dledger_dir(nid)
        s = SegmentedLogStore(d, CFG)
        s.append([Entry(1, i, f"{nid}-{i}".encode() * 8) for i in range(1, ENTRIES + 1)])
        s.flush()
        s.write_checkpoint(ENTRIES, ENTRIES)
        s.close()
        (d / disk.HARD_STATE_FILE).write_bytes(codec.encode_hard_state(HardState(3, "n0")))
        (self.store_root(nid) / f"dledger-{nid}.promise").write_bytes(b"promise")
        cq = self.store_root(nid) / "consumequeue" / TOPIC / "1" / ("0" * 20)
        cq.parent.mkdir(parents=True)
        cq.write_bytes(b"".join(disk.CQ_RECORD.pack(100 * i + 7, 90, 5) for i in range(40)))

    def store_root(self, nid: str) -> Path:
        return self.base / nid

    def dledger_dir(self, nid: str) -> Path:
        return self.store_root(nid) / f"dledger-{nid}"

    def promise_names(self, nid: str) -> tuple[str, ...]:
        return (f"dledger-{nid}.promise",)

    def kill_and_wait(self, nid: str) -> None:
        self.actions.append(f"kill {nid}")

    def stop(self, nid: str) -> None:
        self.actions.append(f"stop {nid}")

    def start(self, nid: str) -> str:
        self.actions.append(f"start {nid}")
        return "corrupt log entry" if self.refuse else ""

    def wait_not_repairing(self, node_ids: list[str], timeout_s: float) -> list[str]:
        self.actions.append(f"wait {','.join(node_ids)}")
        return []

    def wait_promised(self, nid: str, index: int, timeout_s: float) -> int:
        s = SegmentedLogStore(self.dledger_dir(nid), CFG)
        last = s.last_index()
        s.append([Entry(1, i, b"later") for i in range(last + 1, last + GROWTH + 1)])
        s.close()
        return last + GROWTH


def _windows(tmp_path: Path, seed: int, refuse: bool = False) -> tuple[FakeCluster, History]:
    cluster = FakeCluster(tmp_path, refuse)
    history = History()
    nemesis = Nemesis(cluster, history, ["storage"], seed, 1.0)  # type: ignore[arg-type]
    for _ in STORAGE_FAULTS:
        nemesis._fault("storage", 0.0)
    return cluster, history


@pytest.mark.parametrize("seed", [1, 5])
def test_five_windows_deal_every_fault_on_one_node(tmp_path: Path, seed: int) -> None:
    cluster, history = _windows(tmp_path, seed)
    starts = [op.value for op in history.ops() if op.f == "start"]
    assert sorted(v["damage"] for v in starts) == sorted(STORAGE_FAULTS)
    nodes = {v["node"] for v in starts}
    assert len(nodes) == 1, nodes  # a minority of three: one node
    (victim,) = nodes
    for v in starts:
        assert not v.get("skipped"), v
        assert v["fault"] == "storage" and v["file"], v
        assert v["detail"].startswith(f"{v['damage']} on {victim} ("), v
        if v["damage"] in ("bitflip", "truncate", "rollback"):
            first, last = v["indexes"]
            assert 1 <= first <= last, v
    rollback = next(v for v in starts if v["damage"] == "rollback")
    assert rollback["indexes"][1] - rollback["indexes"][0] + 1 == GROWTH
    assert rollback["promised"] == rollback["on_disk"] == rollback["indexes"][1]
    # the promise file was never touched; every node restarted after its damage
    assert (cluster.store_root(victim) / f"dledger-{victim}.promise").read_bytes() == b"promise"
    assert cluster.actions.count(f"start {victim}") == len(STORAGE_FAULTS) + 1  # rollback: 2
    assert not any(a.endswith(n) for a in cluster.actions for n in set(cluster.ids) - nodes)
    # each fault waited for the previous one's repair to end first
    assert cluster.actions.count(f"wait {victim}") == len(STORAGE_FAULTS)
    assert check_repaired(history.ops(), None).valid  # nothing refused (final state: none)


def test_a_refused_restart_is_recorded_and_fails_repaired(tmp_path: Path) -> None:
    _, history = _windows(tmp_path, 1, refuse=True)
    refused = [op for op in history.ops() if op.process == NEMESIS and op.f == "refused"]
    assert len(refused) == len(STORAGE_FAULTS) + 1
    result = check_repaired(history.ops(), None)
    assert not result.valid and result.examples[0]["kind"] == "refused-start"


def test_storage_faults_parse() -> None:
    assert parse_storage_faults("all") == list(STORAGE_FAULTS)
    assert parse_storage_faults("rollback, bitflip") == ["rollback", "bitflip"]
    for bad in ("", "meteor", "bitflip,meteor"):
        with pytest.raises(ValueError, match="storage fault"):
            parse_storage_faults(bad)
