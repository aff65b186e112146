"""The base image's recipe: its hash names the cache entry, so everything that decides
the image's contents must change it, and nothing else may."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from podbay.host.image import Image, ImageCache, Recipe, local_ca_certificates


def test_the_key_is_stable_and_short() -> None:
    key = Recipe().key()
    assert key == Recipe().key()
    assert len(key) == 16
    assert int(key, 16) >= 0


@pytest.mark.parametrize(
    "change",
    [
        {"suite": "trixie"},
        {"variant": "essential"},
        {"mirror": "http://mirror.example/debian"},
        {"security_mirror": "http://mirror.example/debian-security"},
        {"packages": ("python3",)},
        {"packages": (*Recipe().packages, "vim")},
        {"uid_base": 2_000_000},
        {"extra_cas": (("proxy.crt", "-----BEGIN CERTIFICATE-----\n"),)},
        {"version": Recipe().version + 1},
    ],
)
def test_every_field_changes_the_key(change: dict[str, object]) -> None:
    assert dataclasses.replace(Recipe(), **change).key() != Recipe().key()  # type: ignore[arg-type]


def test_every_field_is_covered_above() -> None:
    # A new Recipe field must be added to the parametrization above.
    assert {f.name for f in dataclasses.fields(Recipe)} == {
        "suite",
        "variant",
        "mirror",
        "security_mirror",
        "packages",
        "uid_base",
        "extra_cas",
        "version",
    }


def test_package_order_is_part_of_the_recipe() -> None:
    # Deliberately strict: a reordered list is a new image, never a silent reuse.
    packages = Recipe().packages
    assert Recipe(packages=tuple(reversed(packages))).key() != Recipe().key()


def test_sources_are_the_suite_its_updates_and_security() -> None:
    recipe = Recipe(mirror="http://m/debian", security_mirror="http://s/debian-security")
    assert recipe.sources() == [
        "deb http://m/debian bookworm main",
        "deb http://m/debian bookworm-updates main",
        "deb http://s/debian-security bookworm-security main",
    ]


def test_the_image_carries_what_a_sandbox_needs() -> None:
    packages = set(Recipe().packages)
    # The agent runs on the image's own python3; git, curl and friends are promised.
    assert {"python3", "ca-certificates", "git", "curl", "procps"} <= packages


def test_only_local_certificate_files_become_extra_cas(tmp_path: Path) -> None:
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    (tmp_path / "b-proxy.crt").write_text(pem)
    (tmp_path / "a-corp.crt").write_text(pem)
    (tmp_path / "notes.txt").write_text(pem)  # not *.crt
    (tmp_path / "empty.crt").write_text("")
    (tmp_path / "binary.crt").write_bytes(b"\xff\xfe\x00")
    cas = local_ca_certificates(str(tmp_path))
    assert cas == (("a-corp.crt", pem), ("b-proxy.crt", pem))  # sorted: a stable key
    assert (
        Recipe(extra_cas=cas).key() == Recipe(extra_cas=local_ca_certificates(str(tmp_path))).key()
    )
    assert local_ca_certificates("") == ()
    assert local_ca_certificates(str(tmp_path / "missing")) == ()


def test_the_cache_only_answers_for_a_completed_build(tmp_path: Path) -> None:
    cache = ImageCache(tmp_path, Recipe())
    assert cache.path() == tmp_path / Recipe().key()
    assert cache.cached() is None
    (cache.path() / "rootfs").mkdir(parents=True)
    assert cache.cached() is None, "a half-built entry (no 'complete') was reused"
    (cache.path() / "complete").write_text("1\n")
    image = cache.cached()
    assert image == Image(Recipe().key(), cache.path())
    assert image.rootfs == cache.path() / "rootfs"
    assert ImageCache(tmp_path, Recipe(uid_base=5)).cached() is None
