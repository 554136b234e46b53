"""The whole suite's environment: prepared data (``ablate.train.prepared``) goes to a folder of
this test process's own, never to the user's ``~/.cache/ablate/data``; subprocesses, Ray workers
and clusters started by a test inherit it. Every test starts in the working directory the suite
started in: a test that runs a worker's code in this process (``run_one`` enters the task's
working directory, as a worker process does) must not move the next test's relative paths."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

_made: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    folder = tempfile.mkdtemp(prefix="ablate-test-data-")
    _made.append(folder)
    os.environ["ABLATE_DATA_CACHE"] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    for folder in _made:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _working_directory_kept() -> Iterator[None]:
    cwd = os.getcwd()
    yield
    os.chdir(cwd)
