"""The release string the errors name (mqrelease) is the one the package is built as."""

from __future__ import annotations

import tomllib
from pathlib import Path

from mqrelease import RELEASE, too_new_message

ROOT = Path(__file__).resolve().parents[2]


def test_release_is_pyprojects_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == RELEASE


def test_the_refusal_names_the_file_both_versions_and_the_release() -> None:
    line = too_new_message("checkpoint", "/s/checkpoint", 3, 2)
    assert line.startswith("checkpoint /s/checkpoint: format version 3 is newer than 2, ")
    assert f"raftmq {RELEASE}" in line
