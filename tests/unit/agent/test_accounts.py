"""Accounts are read from the sandbox's /etc/passwd and /etc/group by the agent
itself (never through NSS), and those files may hold anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from podbay.agent import users
from podbay.errors import ApiError

PASSWD = """root:x:0:0:root:/root:/bin/bash
# a comment
broken line
short:x:5
user:x:1000:1000::/home/user:/bin/bash
big:x:4294967295:1:::/bin/sh
nohome:x:1001:1001:::/bin/sh
"""
GROUP = """root:x:0:
dev:x:2000:user,other
docker:x:2001:other
weird:x:notanumber:user
dup:x:1000:user
"""


@pytest.fixture(autouse=True)
def tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "passwd").write_text(PASSWD)
    (tmp_path / "group").write_text(GROUP)
    monkeypatch.setattr(users, "PASSWD", str(tmp_path / "passwd"))
    monkeypatch.setattr(users, "GROUP", str(tmp_path / "group"))


def test_by_name_and_by_uid_with_its_groups() -> None:
    expected = users.Account("user", 1000, 1000, "/home/user", (1000, 2000))
    assert users.resolve("user") == expected
    assert users.resolve("1000") == expected
    assert users.resolve("01000") == expected  # a uid is a number
    assert users.resolve(None, default="user") == expected
    assert users.resolve("nohome").home == "/"
    assert users.name_of(1000) == "user"
    assert users.name_of(4242) is None


@pytest.mark.parametrize("name", ["nobody-here", "4242", "big", "4294967295", "²", "short", ""])
def test_what_is_no_account_is_refused(name: str) -> None:
    if name == "":
        assert users.resolve(name).is_root
        return
    with pytest.raises(ApiError) as raised:
        users.resolve(name)
    assert raised.value.code == "USER_UNKNOWN"


def test_no_tables_means_no_accounts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(users, "PASSWD", str(tmp_path / "missing"))
    with pytest.raises(ApiError):
        users.resolve("user")
    assert users.resolve("root").is_root
