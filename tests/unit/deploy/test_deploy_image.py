"""deploy/image/Dockerfile (never built here: no container builder): the node
image carries every host package ``./run`` installs for the runtime, and each
image runs the role the manifests give it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "deploy" / "image" / "Dockerfile"
#: What ./run installs only to test: a test database, the load balancer, tmux,
#: systemd-analyze for the unit files, the console's browser, the egress
#: tests' stand-in DNS server.
TEST_ONLY = {"postgresql", "haproxy", "tmux", "systemd", "chromium", "dnsmasq-base"}


def run_packages() -> set[str]:
    text = (ROOT / "run").read_text()
    match = re.search(r"DEBIAN_PACKAGES=\(([^)]*)\)", text)
    assert match, "./run has no DEBIAN_PACKAGES"
    return set(match.group(1).split())


def stages() -> dict[str, str]:
    """Each stage's lines, by its name (``FROM ... AS name``)."""
    found: dict[str, str] = {}
    name = ""
    for line in DOCKERFILE.read_text().splitlines():
        start = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
        if start:
            name = start.group(1)
            found[name] = ""
        elif name:
            found[name] += line + "\n"
    return found


def installed(stage: str) -> set[str]:
    text = re.sub(r"#[^\n]*", "", stage).replace("\\\n", " ")
    packages: set[str] = set()
    for command in re.findall(r"apt-get install ([^&]*)", text):
        packages |= {word for word in command.split() if not word.startswith("-")}
    return packages


def test_the_node_image_has_what_each_sandbox_class_needs() -> None:
    parts = stages()
    assert set(parts) == {"base", "control", "node"}
    assert re.search(r"^FROM debian:bookworm", DOCKERFILE.read_text(), re.MULTILINE)
    node = installed(parts["base"]) | installed(parts["node"])
    missing = run_packages() - TEST_ONLY - node
    assert not missing, f"the node image lacks {sorted(missing)}"
    # The control plane needs none of the runtimes.
    assert not {"runc", "runsc", "qemu-system-x86"} & installed(parts["control"])


def test_the_images_install_podbay_with_the_server_and_postgres_extras() -> None:
    base = stages()["base"]
    assert "[server,postgres]" in base
    assert 'ENTRYPOINT ["podbay"]' in base
    assert '"control"' in stages()["control"]
    assert '"node"' in stages()["node"]
    assert re.search(r"^USER\s+10001", stages()["control"], re.MULTILINE)


def test_the_plain_machine_recipe_installs_the_same_packages() -> None:
    """docs/cluster.md's apt-get line for every machine of the systemd recipe."""
    docs = (ROOT / "docs" / "cluster.md").read_text().replace("\\\n", " ")
    (line,) = [x for x in docs.splitlines() if x.startswith("apt-get install python3-venv")]
    missing = run_packages() - TEST_ONLY - set(line.split()[2:]) - {"python3", "ca-certificates"}
    assert not missing, f"docs/cluster.md's recipe lacks {sorted(missing)}"
