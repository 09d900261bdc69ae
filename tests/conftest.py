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


#: Test modules that exercise ``hpp run``'s host-speed probe itself; elsewhere it is switched off in-process
#: (it times one profiled layer, 2-3 s per run in a fresh process, and those tests compare nothing with it).
HOST_PROBE_MODULES = ("test_host_speed", "test_closed_loop")


@pytest.fixture(autouse=True)
def _no_host_probe_outside_its_tests(request, monkeypatch):
    if request.module.__name__.rsplit(".", 1)[-1] in HOST_PROBE_MODULES:
        return
    try:
        import hpp.runtime.run as run_mod
        from hpp.runtime.profile.host_speed import HostSpeed
    except ImportError:           # torch missing: the runtime tests skip anyway
        return
    monkeypatch.setattr(run_mod, "calibrate_host_speed",
                        lambda *a, **k: HostSpeed.skipped("host calibration off in this test (tests/conftest.py)"))


@pytest.fixture
def no_launch(monkeypatch):
    """``hpp run`` fails the test if it starts any process (its refusals must come before)."""
    import hpp.runtime.run as run_mod

    def boom(*a, **k):
        raise AssertionError("a process was started")
    monkeypatch.setattr(run_mod, "launch_torchrun", boom)
    monkeypatch.setattr(run_mod, "launch_forked", boom)
