"""How the upgrade test finds the previous release (tests/upgrade_support.py): a clone without
the pinned commit fails with one line naming what CI needs; a tag that names another commit
than the pin fails too; the real pin resolves."""

from __future__ import annotations

import subprocess

import pytest
import upgrade_support
from upgrade_support import (
    PREVIOUS_RELEASE,
    ROOT,
    PreviousReleaseMissing,
    check_previous_release,
)

ABSENT_SHA = "0" * 40


def _tagged(tag: str) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "-q", "--verify", f"refs/tags/{tag}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def test_a_clone_without_the_previous_release_fails_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(upgrade_support, "PREVIOUS_RELEASE", ("v0.2.0", ABSENT_SHA))
    with pytest.raises(PreviousReleaseMissing) as missing:
        check_previous_release()
    message = str(missing.value)
    assert "\n" not in message
    assert ABSENT_SHA in message and "CI needs a full clone" in message
    assert "git fetch --unshallow --tags" in message


def test_the_pinned_release_resolves_and_its_tag_if_present_names_it() -> None:
    tag, sha = PREVIOUS_RELEASE
    assert check_previous_release() == sha
    assert _tagged(tag) in (None, sha)


def test_a_tag_naming_another_commit_than_the_pin_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tag paired with another commit (HEAD: the tree under test comes after the previous
    release); without tags the check has nothing to compare."""
    tag, sha = PREVIOUS_RELEASE
    other = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert other != sha
    monkeypatch.setattr(upgrade_support, "PREVIOUS_RELEASE", (tag, other))
    if _tagged(tag) is None:
        assert check_previous_release() == other
        return
    with pytest.raises(PreviousReleaseMissing, match=f"tag {tag} names {sha}"):
        check_previous_release()
