"""docs/architecture.md stays true: every path it names exists, and it names every module of
the package, so a new or moved module cannot go unmentioned."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
PATH = re.compile(r"`((?:service|tests|deploy|bench|topics|examples|docs)/[\w/.-]+)`")


def named_paths() -> set[str]:
    return set(PATH.findall(DOC.read_text()))


def test_every_path_the_architecture_names_exists() -> None:
    missing = sorted(p for p in named_paths() if not (REPO / p).exists())
    assert named_paths() and not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_architecture_names_every_module_of_the_package() -> None:
    package = REPO / "service" / "keylane"
    modules = {
        str(p.relative_to(REPO))
        for p in package.rglob("*.py")
        if p.name != "__init__.py" or p.parent in (package, package / "testing")
    }
    unnamed = sorted(modules - named_paths())
    assert not unnamed, f"docs/architecture.md does not say where these modules belong: {unnamed}"
