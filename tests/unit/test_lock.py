"""The locks are what we test and ship (`make lock`, Makefile): these tests fail when pyproject.toml names a
dependency the locks do not satisfy (one added or narrowed without relocking), when the two locks disagree, when a
pin has no hash, or when the environment running the tests is not the one the test lock describes."""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# The interpreter the locks are made for (`--python-version 3.11` in the Makefile's LOCK_FLAGS)
ENVIRONMENT = {"python_version": "3.11", "python_full_version": "3.11.0", "implementation_name": "cpython",
               "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
               "os_name": "posix", "platform_machine": "x86_64", "extra": ""}


@dataclass(frozen=True)
class Pin:
    version: Version
    marker: Marker | None
    hashes: int


_PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


def read_lock(name: str) -> list[tuple[str, Pin]]:
    """`name==version [; marker] \\` lines, each followed by its `--hash=sha256:...` lines. A package may be pinned
    more than once, under markers that never hold together (a universal lock: numpy for Python 3.11 and for 3.12+)."""
    pins: list[tuple[str, Pin]] = []
    for line in (ROOT / name).read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("--hash=sha256:"):
            assert pins, f"{name}: a hash before any pin"
            current, pin = pins[-1]
            pins[-1] = (current, Pin(pin.version, pin.marker, pin.hashes + 1))
            continue
        match = _PIN.match(stripped)
        assert match, f"{name}: not a pin: {line!r} (write the locks with `make lock` only)"
        pins.append((canonicalize_name(match[1]), Pin(Version(match[2]), Marker(match[3]) if match[3] else None, 0)))
    return pins


def applicable(name: str, pins: list[tuple[str, Pin]]) -> dict[str, Pin]:
    """The pins that hold on the interpreter the locks are made for: one per package."""
    out: dict[str, Pin] = {}
    for package, pin in pins:
        if _applies(pin.marker):
            assert package not in out, f"{name}: {package} pinned twice for Python 3.11"
            out[package] = pin
    return out


def _applies(marker: Marker | None) -> bool:
    return marker is None or marker.evaluate(ENVIRONMENT)


PRODUCT_PINS = read_lock("requirements.lock")
TEST_PINS = read_lock("requirements-test.lock")
PRODUCT_LOCK = applicable("requirements.lock", PRODUCT_PINS)
TEST_LOCK = applicable("requirements-test.lock", TEST_PINS)
BUILD = PYPROJECT["build-system"]["requires"]
PRODUCT = PYPROJECT["project"]["dependencies"]
TEST = PYPROJECT["project"]["optional-dependencies"]["test"] + PYPROJECT["project"]["optional-dependencies"]["bench"]


@pytest.mark.parametrize(("lock_name", "lock", "requirements"), [
    ("requirements.lock", PRODUCT_LOCK, PRODUCT + BUILD),
    ("requirements-test.lock", TEST_LOCK, PRODUCT + TEST + BUILD),
], ids=["product", "test"])
def test_every_dependency_of_pyproject_is_locked_within_its_range(lock_name: str, lock: dict[str, Pin],
                                                                  requirements: list[str]) -> None:
    stale = []
    for text in requirements:
        requirement = Requirement(text)
        if not _applies(requirement.marker):
            continue
        pin = lock.get(canonicalize_name(requirement.name))
        if pin is None:
            stale.append(f"{text}: not in {lock_name}")
        elif not requirement.specifier.contains(pin.version, prereleases=True):
            stale.append(f"{text}: {lock_name} pins {pin.version}")
    assert not stale, "pyproject.toml and the locks disagree, run `make lock`: " + "; ".join(stale)


def test_the_two_locks_pin_the_same_versions() -> None:
    """The image (requirements.lock) runs exactly what `make test` tested (requirements-test.lock)."""
    differ = {name: (pin.version, TEST_LOCK[name].version if name in TEST_LOCK else None)
              for name, pin in PRODUCT_LOCK.items()
              if name not in TEST_LOCK or TEST_LOCK[name].version != pin.version}
    assert not differ, f"requirements.lock and requirements-test.lock differ, run `make lock`: {differ}"


def test_every_pin_has_a_hash() -> None:
    unhashed = [name for pins in (PRODUCT_PINS, TEST_PINS) for name, pin in pins if pin.hashes == 0]
    assert not unhashed, f"pins without --hash (pip --require-hashes refuses them): {unhashed}"


def test_the_environment_running_the_tests_is_the_test_lock() -> None:
    """What ran these tests is what the lock names: `make test` installs it (its stamp depends on the lock file)."""
    wrong = {}
    for name, pin in TEST_LOCK.items():
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            installed = None
        if installed != pin.version:
            wrong[name] = f"installed {installed}, locked {pin.version}"
    assert not wrong, f"the environment is not the test lock (make clean && make test): {wrong}"
