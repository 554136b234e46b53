"""The whole suite's environment: prepared data (``ablate.train.prepared``) goes to a folder of
this test process's own, never to the user's ``~/.cache/ablate/data``; subprocesses, Ray workers
and clusters started by a test inherit it."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_made: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    folder = tempfile.mkdtemp(prefix="ablate-test-data-")
    _made.append(folder)
    os.environ["ABLATE_DATA_CACHE"] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    for folder in _made:
        shutil.rmtree(folder, ignore_errors=True)
