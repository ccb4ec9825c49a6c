"""The version is written once, in ``shared/__init__.py``, and the installed package reports it.

pyproject.toml reads it from there (setuptools' dynamic version). An editable
install keeps the metadata of the day it was installed, so after a version bump
this test asks for a reinstall instead of letting ``pip show`` and ``/version``
disagree.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import shared

ROOT = Path(__file__).resolve().parents[2]
# Where a second copy of the version could hide: the packages, their tooling and the tests.
SOURCE_DIRS = ("shared", "gateway", "worker", "cli", "bench", "deploy", "tests")


def _pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


def test_installed_metadata_reports_the_source_version() -> None:
    installed = importlib.metadata.version("tokenferry")
    assert installed == shared.__version__, (
        f"installed metadata says {installed}, shared/__init__.py says {shared.__version__}: "
        "reinstall with `.venv/bin/pip install --no-deps -e .`"
    )


def test_pyproject_reads_the_version_from_shared() -> None:
    pyproject = _pyproject()
    project = pyproject["project"]
    assert isinstance(project, dict)
    assert "version" not in project
    assert "version" in project["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "shared.__version__"}  # type: ignore[index]


def test_the_version_is_written_in_one_place() -> None:
    literal = re.compile(rf"""["']{re.escape(shared.__version__)}["']""")
    holders = [
        path.relative_to(ROOT).as_posix()
        for folder in SOURCE_DIRS
        for path in (ROOT / folder).rglob("*")
        if path.suffix in {".py", ".toml", ".cfg"} and literal.search(path.read_text(encoding="utf-8"))
    ]
    holders += ["pyproject.toml"] if literal.search((ROOT / "pyproject.toml").read_text()) else []
    assert holders == ["shared/__init__.py"]
