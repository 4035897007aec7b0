"""``latch worker``'s engine choice (worker/runtime/engine.py, issue 24 item 4): only the engine
that ``worker.engine`` names is imported, so the kafka engine runs without faust.

Each probe runs in a fresh interpreter (a test process has faust loaded already) and reports
which faust, mode and aiokafka modules, and which of the faust engine's, it loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

#: Prints the faust-side modules loaded so far, as a JSON list.
_REPORT = """
import json, sys
print(json.dumps(sorted(m for m in sys.modules
                        if m.split(".")[0] in ("faust", "mode", "aiokafka")
                        or m.startswith("worker.runtime.faust_engine"))))
"""

#: ``latch worker --config FILE`` through ``engine.main`` up to the engine's ``run``, which is
#: stubbed (as is the topic check, which needs a broker): the whole start path but the loop.
_START = """
import sys
from worker.runtime import engine
engine._check_topics = lambda config, changelog=False: None
started = []
def run(self):
    started.append(type(self).__name__)
    return 0
{patch}
assert engine.main(["--config", sys.argv[1]]) == 0, "start failed"
assert started == [{name!r}], started
"""


def _probe(code: str, *args: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", code + _REPORT, *args], cwd=REPO,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    loaded: list[str] = json.loads(result.stdout.strip().splitlines()[-1])
    return loaded


def _config(tmp_path: Path, engine: str) -> str:
    path = tmp_path / "latch.yaml"
    path.write_text(f"worker:\n  engine: {engine}\n  http_port: 0\n", encoding="utf-8")
    return str(path)


def test_importing_the_kafka_engine_loads_no_faust() -> None:
    """``import worker.runtime.kafka_engine`` (and the engine-neutral selector) loads no faust,
    mode or aiokafka module, and nothing of the faust engine."""
    assert _probe("import worker.runtime.kafka_engine, worker.runtime.engine\n") == []


def test_starting_the_kafka_engine_loads_no_faust(tmp_path: Path) -> None:
    """``latch worker`` with ``worker.engine: kafka`` reads its configuration, builds the kafka
    engine and starts it without loading faust, mode or aiokafka."""
    patch = ("from worker.runtime.kafka_engine import KafkaEngine\n"
             "KafkaEngine.run = run\n")
    code = _START.format(patch=patch, name="KafkaEngine")
    assert _probe(code, _config(tmp_path, "kafka")) == []


def test_starting_the_faust_engine_loads_faust(tmp_path: Path) -> None:
    """The probe sees what it looks for: with ``worker.engine: faust`` the same start path
    loads faust and the faust engine (so an empty list above is not a blind probe)."""
    patch = ("from worker.runtime.faust_engine import FaustEngine\n"
             "FaustEngine.run = run\n")
    code = _START.format(patch=patch, name="FaustEngine")
    loaded = _probe(code, _config(tmp_path, "faust"))
    assert "faust" in loaded
    assert "worker.runtime.faust_engine.engine" in loaded
