"""A real component a test needs and cannot have: a failure on CI (``$CI`` set: .ci/run installs
and starts every one of them, so missing one there is a broken CI), a skip on a developer's
machine that lacks it."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def unavailable(what: str, reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{what} unavailable on CI: {reason}", pytrace=False)
    pytest.skip(f"{what} unavailable: {reason}")
