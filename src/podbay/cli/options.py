"""Options several commands share, defined once (each command keeps its own help)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def data_dir_option(help: str) -> Callable[[F], F]:
    """``--data-dir DIR`` (a Path; None: the settings' default)."""
    return click.option("--data-dir", type=click.Path(path_type=Path), default=None, help=help)


def json_option(help: str = "Print JSON.") -> Callable[[F], F]:
    """``--json``, passed as ``as_json``."""
    return click.option("--json", "as_json", is_flag=True, help=help)
