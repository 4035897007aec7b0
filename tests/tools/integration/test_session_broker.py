"""A test session that had to start the managed broker stops it when it ends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from worker.tools import broker

ROOT = Path(__file__).resolve().parents[3]

INNER = '''
def test_uses_the_broker(kafka_bootstrap):
    """The inner session's only test: it gets a broker."""
    assert kafka_bootstrap.endswith(":{port}")
'''


def test_the_session_stops_the_broker_it_started(tmp_path: Path) -> None:
    """An inner pytest session pointed at a port where nothing answers starts the managed
    broker there (its own LATCH_BROKER_DIR), passes, and leaves no broker running after it."""
    port = broker.free_ports()
    tests = tmp_path / "inner"
    tests.mkdir()
    # the suite's own conftest.py, as the inner session's
    (tests / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tests / "test_inner.py").write_text(INNER.replace("{port}", str(port)))
    broker_dir = tmp_path / "broker"
    env = os.environ | {"LATCH_TEST_BOOTSTRAP": f"127.0.0.1:{port}",
                        "LATCH_BROKER_DIR": str(broker_dir)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
         str(tests), str(tests)],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    old = os.environ.get("LATCH_BROKER_DIR")
    os.environ["LATCH_BROKER_DIR"] = str(broker_dir)
    try:
        pid, _ = broker.status()
    finally:
        if old is None:
            del os.environ["LATCH_BROKER_DIR"]
        else:
            os.environ["LATCH_BROKER_DIR"] = old
    assert pid is None
    assert not broker.answers(f"127.0.0.1:{port}", timeout=2.0)
