"""Shared fixtures: the public Sailor data (read-only, outside the package); tests skip without it."""

from pathlib import Path

import pytest

SAILOR = Path(__file__).resolve().parents[2] / "shared" / "profiles" / "public" / "sailor"


@pytest.fixture(scope="session")
def sailor_root() -> Path:
    """``../shared/profiles/public/sailor`` relative to the repo root; skip the test if it is absent."""
    if not SAILOR.is_dir():
        pytest.skip(f"public data not found at {SAILOR}")
    return SAILOR
