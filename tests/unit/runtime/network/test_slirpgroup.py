"""The cgroup that marks a gVisor sandbox's slirp4netns sockets, and the host's
redirect of them to its name check (pure: no root)."""

from __future__ import annotations

from pathlib import Path

from podbay.runtime.network.policy import slirp_names_redirect_batch, slirp_names_table
from podbay.runtime.network.slirpgroup import SlirpGroup, v2_root

HYBRID = """\
25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
27 25 0:24 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
"""
UNIFIED = "30 1 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
V1_ONLY = "27 25 0:24 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n"


def test_the_v2_hierarchy_is_found_wherever_it_is_mounted() -> None:
    assert v2_root(HYBRID) == Path("/sys/fs/cgroup/unified")
    assert v2_root(UNIFIED) == Path("/sys/fs/cgroup")
    assert v2_root(V1_ONLY) is None


def test_the_match_names_the_path_nft_reads_and_its_level() -> None:
    hybrid = SlirpGroup.of("/podbay-net", "m-1", root=Path("/sys/fs/cgroup/unified"))
    assert hybrid is not None
    assert hybrid.directory == Path("/sys/fs/cgroup/unified/podbay-net/m-1")
    assert hybrid.match() == 'socket cgroupv2 level 2 "unified/podbay-net/m-1"'
    # On a v2-only host it is the budget's own cgroup (one v2 cgroup per process).
    unified = SlirpGroup.of("/a/b-net", "m-1", root=Path("/sys/fs/cgroup"))
    assert unified is not None
    assert unified.match() == 'socket cgroupv2 level 3 "a/b-net/m-1"'
    # Without a budget, a parent of its own.
    bare = SlirpGroup.of(None, "m-1", root=Path("/sys/fs/cgroup"))
    assert bare is not None
    assert bare.path == "podbay-names/m-1"


def test_the_host_redirect_takes_only_the_groups_tcp_off_loopback() -> None:
    table = slirp_names_table("m-1")
    assert table.startswith("podbay_names_slirp_")
    assert table != slirp_names_table("m-2")
    match = 'socket cgroupv2 level 2 "unified/podbay-net/m-1"'
    batch = slirp_names_redirect_batch(table, match, ("127.112.0.9", 40000), replace=True)
    assert batch.startswith(f"table ip {table}\ndelete table ip {table}\n")
    assert "type nat hook output priority -100" in batch
    assert f"{match} ip daddr != 127.0.0.0/8 meta l4proto tcp" in batch
    assert "dnat to 127.112.0.9:40000" in batch
    # None: the table goes (and nothing else).
    gone = slirp_names_redirect_batch(table, match, None, replace=True)
    assert gone == f"table ip {table}\ndelete table ip {table}\n"
    assert slirp_names_redirect_batch(table, None, ("127.112.0.9", 1), replace=False) == ""


def test_slirp4netns_joins_the_cgroup_before_it_execs() -> None:
    from podbay.runtime.network.slirp import Slirps

    netns, resolv = Path("/run/x/netns"), Path("/run/x/slirp.resolv.conf")
    procs = Path("/sys/fs/cgroup/unified/p-net/m1/cgroup.procs")
    argv = Slirps("slirp4netns").argv(netns, 7, resolv, procs)
    assert argv[5:7] == ["sh", "-c"]
    assert argv[7].startswith('echo $$ > "$0" && ')  # the shell's pid is slirp4netns's
    assert argv[8:10] == [str(procs), str(resolv)]  # $0 and $1: never interpolated
    assert argv[10] == "slirp4netns"
    assert argv[-2:] == [str(netns), "tap0"]
