"""Sandbox names: the check spelled out agrees with the pattern the contract publishes."""

from __future__ import annotations

import re

from podbay.wire.limits import SANDBOX_NAME_PATTERN, is_valid_sandbox_name


def test_name_check_is_the_pattern() -> None:
    names = [
        "a",
        "thread-42",
        "A.b_c:d-e",
        "0" * 128,
        "0" * 129,
        "",
        "-a",
        ".a",
        "_a",
        ":a",
        "a b",
        "a/b",
        "../x",
        "a\n",
        "\na",
        "a\x00",
        "\u00e9t\u00e9",
        "a\u00e9",
        "\u0661",  # ARABIC-INDIC DIGIT ONE: a digit to str.isdigit, not to [0-9]
        "\uff41",  # FULLWIDTH a
        "a\u212a",  # KELVIN SIGN: K under re.IGNORECASE, which the pattern is not
        "a+b",
        "a%3Ab",
    ]
    names += [chr(c) + "x" for c in range(0x80)] + ["x" + chr(c) for c in range(0x80)]
    pattern = re.compile(SANDBOX_NAME_PATTERN)
    for name in names:
        assert is_valid_sandbox_name(name) == (pattern.fullmatch(name) is not None), repr(name)
