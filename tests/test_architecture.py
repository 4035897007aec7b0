"""The package's layers, as import-linter checks them (``[tool.importlinter]`` in
pyproject.toml): ``worker.cli`` -> ``worker.tools`` -> ``worker.runtime`` -> ``worker.core``,
imports flowing downward only (``worker.client`` between tools and runtime), a core that
imports no client, framework or I/O library, a partition driver and engine-neutral modules that
import no Kafka client, no faust and no engine, two independent engines, and a kafka engine
without faust.

The contracts are only worth something if they fail on a violation: each breaking test copies
the package to a temporary directory, adds one forbidden import, and expects ``lint-imports``
to name the broken contract.

Roles have rooms (issue 35, item 4): :data:`ROLES` names what only one module may do (build a
run's final message, build its ``run.ended`` record, decide a call held for approval, call the
producer's transactional API, sign a record; and, one room per engine, forward a control
record, take a partition over), found in each module's syntax tree; the breaking tests make a
second module do it in a copy.

Two sizes hold too (issue 24), a backstop behind the roles, not the reason to split: no module
of ``worker/core`` or ``worker/runtime`` over :data:`MAX_MODULE_LINES` lines, and no class of
``worker/`` over :data:`MAX_CLASS_METHODS` methods. The roles catch a second room doing one
room's work; they cannot see one room taking on a second role. A module that reaches the
cap is the alarm for that, and is split by the roles it holds (as ``kafka_engine/loop.py``
was), never by lines. Their breaking tests add one line or one method too many to a copy.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka_fakes import EngineMessage

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
#: The longest a module of ``worker/core`` or ``worker/runtime`` may be, in lines.
MAX_MODULE_LINES = 600
#: The most methods (functions defined directly in its body) a class of ``worker/`` may have.
MAX_CLASS_METHODS = 30


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the ``worker`` package found under ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root, env=env, text=True, capture_output=True, timeout=300, check=False)


@pytest.fixture
def copy_of_the_package(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "worker", tmp_path / "worker",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def add_import(module: Path, statement: str) -> None:
    module.write_text(module.read_text(encoding="utf-8") + f"\n{statement}\n", encoding="utf-8")


def test_the_layers_hold() -> None:
    """The tree as committed keeps every contract."""
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(("module", "statement", "edge"), [
    # The runtime (what a platform deploys) may not depend on a development tool.
    ("runtime/step.py", "import worker.tools.broker", "worker.runtime.step -> worker.tools.broker"),
    # The core imports nothing of ours outside itself.
    ("core/run.py", "from worker.runtime import config",
     "worker.core.run -> worker.runtime.config"),
    # The runtime may not depend on the libraries that run in other people's processes.
    ("runtime/hooks.py", "import worker.client.runner",
     "worker.runtime.hooks -> worker.client.runner"),
])
def test_an_upward_import_breaks_the_layers(copy_of_the_package: Path, module: str,
                                            statement: str, edge: str) -> None:
    """A runtime module importing a tool, or the core importing the runtime, is named as a
    broken layers contract with the offending import."""
    add_import(copy_of_the_package / "worker" / module, f"{statement}  # noqa")
    result = lint_imports(copy_of_the_package)
    assert result.returncode != 0
    assert "Layers: cli -> tools -> client -> runtime -> core BROKEN" in result.stdout
    assert edge in result.stdout


@pytest.mark.parametrize("library", ["confluent_kafka", "time", "socket", "cedarpy"])
def test_the_core_importing_io_breaks_purity(copy_of_the_package: Path, library: str) -> None:
    """A Kafka client, a clock, a socket or the policy engine (cedarpy: the core asks a
    ``Policy`` it is given) in the core breaks the pure-core contract."""
    add_import(copy_of_the_package / "worker" / "core" / "ops.py", f"import {library}  # noqa")
    result = lint_imports(copy_of_the_package)
    assert result.returncode != 0
    assert "The core imports no Kafka client, framework, telemetry or I/O library BROKEN" \
        in result.stdout


@pytest.mark.parametrize(("module", "library"), [
    ("runtime/driver.py", "confluent_kafka"), ("runtime/driver.py", "faust"),
    # reached through a module the driver is built from: an indirect import breaks it too
    ("runtime/partition.py", "aiokafka"), ("runtime/assignment.py", "confluent_kafka"),
    ("runtime/refusals.py", "confluent_kafka"),
])
def test_a_kafka_client_in_the_driver_breaks_its_neutrality(copy_of_the_package: Path,
                                                            module: str, library: str) -> None:
    """The partition driver (worker/runtime/driver.py, issue 24) is the one path of both
    engines: a Kafka client or faust imported by it, or by a module it imports, breaks the
    neutral-driver contract."""
    add_import(copy_of_the_package / "worker" / module, f"import {library}  # noqa")
    result = lint_imports(copy_of_the_package)
    assert result.returncode != 0
    assert ("The partition driver imports no Kafka client, no faust and no engine BROKEN"
            in result.stdout)


@pytest.mark.parametrize(("module", "statement"), [
    ("runtime/driver.py", "from worker.runtime.kafka_engine import transaction"),
    ("runtime/driver.py", "import worker.runtime.faust_engine.heads"),
    # an engine-neutral module the driver is built from, lazily inside a function
    ("runtime/takeover.py", "def _engine():\n    from worker.runtime import kafka_engine"),
    ("runtime/hooks.py", "import worker.runtime.faust_engine.gaps"),
])
def test_an_engine_in_the_driver_or_a_neutral_module_breaks_its_neutrality(
        copy_of_the_package: Path, module: str, statement: str) -> None:
    """The driver and the engine-neutral modules import no engine (issue 35, item 4): the
    engines depend on the driver, never the other way; an engine module imported by the
    driver, or by a neutral module (even lazily), breaks the neutral contracts."""
    add_import(copy_of_the_package / "worker" / module, f"{statement}  # noqa")
    result = lint_imports(copy_of_the_package)
    assert result.returncode != 0
    assert "import no Kafka client, no faust and no engine BROKEN" in result.stdout


def test_every_package_ships_in_the_wheel() -> None:
    """Each package directory under ``worker/`` is listed in ``[tool.setuptools] packages``:
    an unlisted one is missing from ``pip install .`` and the image, though an editable
    checkout still imports it (the kafka engine once went missing that way)."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"])
    found = {".".join(init.parent.relative_to(REPO).parts)
             for init in (REPO / "worker").rglob("__init__.py")}
    assert found - listed == set()


@pytest.mark.parametrize(("module", "library"), [
    ("runtime/hooks.py", "faust"), ("runtime/config.py", "aiokafka"),
    ("runtime/observability/metrics.py", "confluent_kafka"),
    ("runtime/governance/signing.py", "mode"),
])
def test_a_kafka_client_in_a_neutral_module_breaks_its_neutrality(copy_of_the_package: Path,
                                                                 module: str,
                                                                 library: str) -> None:
    """The modules both engines share (issue 24, item 4: the driver's parts, configuration,
    signing, observability) import no Kafka client and no faust: one such import breaks the
    neutral-runtime contract."""
    add_import(copy_of_the_package / "worker" / module, f"import {library}  # noqa")
    result = lint_imports(copy_of_the_package)
    assert result.returncode != 0
    assert "The engine-neutral modules import no Kafka client, no faust and no engine BROKEN" \
        in result.stdout


def test_faust_in_the_shared_admin_breaks_it(copy_of_the_package: Path) -> None:
    """The topic admin that both engines use (admin, refusals) may use Kafka's admin client
    but not faust: importing it breaks the shared-admin contract."""
    add_import(copy_of_the_package / "worker" / "runtime" / "refusals.py", "import faust  # noqa")
    result = lint_imports(copy_of_the_package)
    assert result.returncode != 0
    assert "The topic admin shared by both engines imports no faust BROKEN" in result.stdout


@pytest.mark.parametrize(("module", "statement"), [
    ("runtime/faust_engine/gaps.py", "import worker.runtime.kafka_engine.heads"),
    ("runtime/kafka_engine/reader.py", "import worker.runtime.faust_engine.kafka_io"),
])
def test_one_engine_importing_the_other_breaks_their_independence(copy_of_the_package: Path,
                                                                  module: str,
                                                                  statement: str) -> None:
    """The faust engine and the kafka engine share only the engine-neutral modules: either
    importing the other breaks the engines-independent contract."""
    add_import(copy_of_the_package / "worker" / module, f"{statement}  # noqa")
    result = lint_imports(copy_of_the_package)
    assert result.returncode != 0
    assert "The two engines are independent BROKEN" in result.stdout


@pytest.mark.parametrize(("module", "library"), [
    ("runtime/kafka_engine/reader.py", "faust"),
    # reached through a shared module the kafka engine imports: an indirect import breaks it
    ("runtime/memory.py", "mode"),
])
def test_faust_in_the_kafka_engine_breaks_it(copy_of_the_package: Path, module: str,
                                             library: str) -> None:
    """``worker.engine: kafka`` loads no faust (issue 24): faust or its ``mode`` imported by the
    kafka engine, or by a module it imports, breaks the kafka-engine-no-faust contract."""
    add_import(copy_of_the_package / "worker" / module, f"import {library}  # noqa")
    result = lint_imports(copy_of_the_package)
    assert result.returncode != 0
    assert "The kafka engine imports no faust BROKEN" in result.stdout


def long_modules(package: Path) -> dict[str, int]:
    """The modules of ``package``'s ``core`` and ``runtime`` over :data:`MAX_MODULE_LINES`
    lines, by path, with their line counts."""
    found = {}
    for layer in ("core", "runtime"):
        for module in sorted((package / layer).rglob("*.py")):
            lines = len(module.read_text(encoding="utf-8").splitlines())
            if lines > MAX_MODULE_LINES:
                found[str(module.relative_to(package))] = lines
    return found


def large_classes(package: Path) -> dict[str, int]:
    """The classes of ``package`` with more than :data:`MAX_CLASS_METHODS` methods (each
    ``def`` or ``async def`` directly in the class body, a property's getter and setter
    apart), by ``path:Class``, with their method counts."""
    found = {}
    for module in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                              for item in node.body)
                if methods > MAX_CLASS_METHODS:
                    found[f"{module.relative_to(package)}:{node.name}"] = methods
    return found


def test_no_module_or_class_outgrows_its_size() -> None:
    """Issue 24's sizes hold: no module of worker/core or worker/runtime over 600 lines, no
    class in worker/ over 30 methods (a module or class that grows past them is split by
    role)."""
    assert long_modules(REPO / "worker") == {}
    assert large_classes(REPO / "worker") == {}


def test_a_line_or_a_method_too_many_breaks_the_sizes(copy_of_the_package: Path) -> None:
    """The size checks fail on a violation: a runtime module of 601 lines, and a class of 31
    methods anywhere in worker/, are each named."""
    package = copy_of_the_package / "worker"
    (package / "runtime" / "grown.py").write_text("\n" * (MAX_MODULE_LINES + 1))
    (package / "core" / "fits.py").write_text("\n" * MAX_MODULE_LINES)
    methods = "".join(f"    def m{n}(self) -> None: ...\n" for n in range(MAX_CLASS_METHODS))
    (package / "tools" / "grown.py").write_text(
        f"class Grown:\n{methods}    async def one_more(self) -> None: ...\n\n"
        f"class Fits:\n{methods}")
    assert long_modules(package) == {**long_modules(REPO / "worker"),
                                     "runtime/grown.py": MAX_MODULE_LINES + 1}
    assert large_classes(package) == {**large_classes(REPO / "worker"),
                                      "tools/grown.py:Grown": MAX_CLASS_METHODS + 1}


def test_config_imports_no_governance_so_there_is_no_import_circle() -> None:
    """The configuration is plain data (issue 32): ``worker.runtime.config`` imports nothing
    of ``worker.runtime.governance``, not even lazily inside a function (which import-linter
    sees as well), while governance reads the configuration: no config <-> policy circle."""
    tree = ast.parse((REPO / "worker" / "runtime" / "config.py").read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported
                if name.startswith(("worker.runtime.governance", "cedarpy"))}


def test_config_importing_the_policy_breaks_the_plain_config(copy_of_the_package: Path
                                                             ) -> None:
    """A lazy import of the policy module inside a function of config.py (how the circle
    was made before issue 32) is named as a broken ``plain-config`` contract."""
    add_import(copy_of_the_package / "worker" / "runtime" / "config.py",
               "def _policy():\n    from worker.runtime.governance import policy  # noqa\n"
               "    return policy")
    result = lint_imports(copy_of_the_package)
    assert result.returncode != 0
    assert "The configuration is plain data" in result.stdout and "BROKEN" in result.stdout
    assert "worker.runtime.config -> worker.runtime.governance.policy" in result.stdout


# -- roles (issue 35, item 4) ------------------------------------------------------------------


def _emits_to(node: ast.AST, topic: str) -> bool:
    """Whether ``node`` builds an output record for ``Topic.<topic>``: ``Emit(...)`` with
    ``Topic.<topic>`` among its arguments."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    args = [*node.args, *(k.value for k in node.keywords)]
    return name == "Emit" and any(isinstance(a, ast.Attribute) and a.attr == topic
                                  for a in args)


def _calls(node: ast.AST, *methods: str) -> bool:
    """Whether ``node`` calls a method named one of ``methods`` (``x.final(...)``)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in methods)


def _builds_a_final(node: ast.AST) -> bool:
    """A final message: an ``Emit`` for ``Topic.FINAL``, or an adapter asked for its
    ``final`` (``Adapter.final``: the message it is made of)."""
    return _emits_to(node, "FINAL") or _calls(node, "final")


def _builds_a_run_ended(node: ast.AST) -> bool:
    """A ``run.ended`` record: an ``Emit`` for ``Topic.RUN_ENDED``."""
    return _emits_to(node, "RUN_ENDED")


def _builds_a_turn_record(node: ast.AST) -> bool:
    """A turn record: an ``Emit`` for ``Topic.TURNS``, or ``turn_record(...)`` (core/turns.py
    formats it; only the result latch, core/pairing.py, decides one)."""
    return _emits_to(node, "TURNS") or _calls(node, "turn_record") or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id == "turn_record")


#: The producer's transactional API (confluent-kafka's ``Producer``).
TRANSACTION_API = ("init_transactions", "begin_transaction", "send_offsets_to_transaction",
                   "commit_transaction", "abort_transaction")


def _calls_the_transaction_api(node: ast.AST) -> bool:
    """A call of the producer's transactional API (:data:`TRANSACTION_API`)."""
    return _calls(node, *TRANSACTION_API)


def _signs_a_record(node: ast.AST) -> bool:
    """A record signed: a :class:`~worker.runtime.governance.signing.Signer`'s headers asked
    for (``signer.headers(value)``, ``self.signer.headers(value)``)."""
    if not _calls(node, "headers"):
        return False
    owner = node.func.value  # type: ignore[attr-defined]
    return (isinstance(owner, ast.Name) and owner.id == "signer") or (
        isinstance(owner, ast.Attribute) and owner.attr == "signer")


def _asks_the_driver(node: ast.AST, method: str) -> bool:
    """A call of the driver's ``method`` (``self.driver.forward(...)``,
    ``driver.rebuild(...)``)."""
    if not _calls(node, method):
        return False
    owner = node.func.value  # type: ignore[attr-defined]
    return (isinstance(owner, ast.Name) and owner.id == "driver") or (
        isinstance(owner, ast.Attribute) and owner.attr == "driver")


def _forwards_a_control_record(node: ast.AST) -> bool:
    """A control record forwarded: the driver asked where it goes (``Driver.forward``: the
    events topic, keyed by its run, or the DLQ)."""
    return _asks_the_driver(node, "forward")


def _takes_a_partition_over(node: ast.AST) -> bool:
    """A partition taken over: the driver's takeover begun (``Driver.rebuild``, the generator
    the engine feeds with its reads)."""
    return _asks_the_driver(node, "rebuild")


def _decides_a_held_call(node: ast.AST) -> bool:
    """A held call decided: the latch asked to ``approve`` or ``edit`` it, or it failed
    ``approval_denied`` or ``approval_timeout``."""
    return _calls(node, "approve", "edit") or (
        isinstance(node, ast.Attribute) and node.attr in ("APPROVAL_DENIED", "APPROVAL_TIMEOUT")
        and isinstance(node.value, ast.Name) and node.value.id == "Reason")


#: Who alone may do what: a role, the layers of ``worker/`` it is looked for in, the one
#: module (relative to ``worker/``) that plays it (or one room per engine: a tuple), and what
#: marks it in a syntax tree. (The
#: client and the tools send decisions, ``Publisher.approve``: deciding is the core's. The
#: client's runner has a transaction of its own, in another program: the worker's are looked
#: for in the core and the runtime. Signing a committed call is a security control: one step
#: of the driver's outgoing chain, never the telemetry hooks. Each engine forwards control
#: records in its forwarding room and takes partitions over in its rebalance room, never in
#: its loop.)
ROLES: dict[str, tuple[tuple[str, ...], str | tuple[str, ...], Callable[[ast.AST], bool]]] = {
    "builds a final message": (("core", "runtime", "client", "tools"), "core/ending.py",
                               _builds_a_final),
    "builds a run.ended record": (("core", "runtime", "client", "tools"), "core/ending.py",
                                  _builds_a_run_ended),
    "decides a held call": (("core", "runtime"), "core/waiting.py", _decides_a_held_call),
    "builds a turn record": (("core", "runtime", "client", "tools"), "core/pairing.py",
                             _builds_a_turn_record),
    "calls the producer's transactional API": (
        ("core", "runtime"), "runtime/kafka_engine/transaction.py", _calls_the_transaction_api),
    "signs a record": (("core", "runtime"), "runtime/governance/signing.py", _signs_a_record),
    "forwards a control record": (
        ("core", "runtime"),
        ("runtime/faust_engine/forwarding.py", "runtime/kafka_engine/forwarding.py"),
        _forwards_a_control_record),
    "takes a partition over": (
        ("core", "runtime"),
        ("runtime/faust_engine/rebalance.py", "runtime/kafka_engine/rebalance.py"),
        _takes_a_partition_over),
}


def rooms(role: str) -> set[str]:
    """The modules (relative to ``worker/``) that alone may play ``role`` (:data:`ROLES`)."""
    room = ROLES[role][1]
    return {room} if isinstance(room, str) else set(room)


def role_players(package: Path, role: str) -> set[str]:
    """The modules of ``package`` (paths relative to it) that play ``role`` (:data:`ROLES`)."""
    layers, _, marks = ROLES[role]
    return {str(module.relative_to(package)) for layer in layers
            for module in sorted((package / layer).rglob("*.py"))
            if any(marks(node) for node in ast.walk(ast.parse(module.read_text("utf-8"))))}


@pytest.mark.parametrize("role", sorted(ROLES))
def test_each_role_has_one_room(role: str) -> None:
    """Only ``core/ending.py`` builds a run's final message (asks an adapter for its
    ``final``) and its ``run.ended`` record; only ``core/waiting.py`` decides a call held for
    approval; only ``kafka_engine/transaction.py`` calls the producer's transactional API;
    only ``governance/signing.py`` (its ``SignCommitted`` step) signs a record; each engine's
    ``forwarding.py`` alone forwards a control record and its ``rebalance.py`` alone takes
    a partition over (issue 35, item 4: rooms by role, not by a line cap)."""
    assert role_players(REPO / "worker", role) == rooms(role)


@pytest.mark.parametrize(("role", "module", "code"), [
    ("builds a final message", "core/outputs.py",
     "def _final(run_id):\n    return Emit(Topic.FINAL, run_id, {})"),
    ("builds a final message", "core/run.py",
     "def _message(adapter):\n    return adapter.final([])"),
    ("builds a final message", "runtime/step.py",
     "def _final(run_id):\n    return Emit(topic=Topic.FINAL, key=run_id, value={})"),
    ("builds a run.ended record", "core/run.py",
     "def _ended(run_id):\n    return [Emit(Topic.RUN_ENDED, run_id, {})]"),
    ("builds a turn record", "core/ending.py",
     "def _turn(run_id):\n    return Emit(Topic.TURNS, run_id, {})"),
    ("builds a turn record", "runtime/driver.py",
     "def _turn(entries):\n    return turn_record('r', None, 'openai.chat', 'k', entries)"),
    ("decides a held call", "core/run.py",
     "def _approve(run, call):\n    run.latch.approve(call, None)"),
    ("decides a held call", "core/assembler.py",
     "def _deny(call):\n    call.fail(Reason.APPROVAL_DENIED, 'no')"),
    ("decides a held call", "runtime/hooks.py",
     "def _edit(latch, call):\n    latch.edit(call, '{}', len, None)"),
    ("calls the producer's transactional API", "runtime/kafka_engine/engine.py",
     "def _commit_now(engine):\n    engine.txn.producer.commit_transaction(10)"),
    ("calls the producer's transactional API", "runtime/kafka_engine/rebalance.py",
     "def _abort(producer):\n    producer.abort_transaction()"),
    ("calls the producer's transactional API", "runtime/driver.py",
     "def _offsets(p, offsets, group):\n    p.send_offsets_to_transaction(offsets, group)"),
    ("signs a record", "runtime/hooks.py",
     "def _signed(self, value):\n    return self.signer.headers(value)"),
    ("signs a record", "runtime/driver.py",
     "def _sign(signer, value):\n    return signer.headers(value)"),
    ("forwards a control record", "runtime/faust_engine/engine.py",
     "async def _cancel(self, record):\n    return self.driver.forward(record)"),
    ("forwards a control record", "runtime/kafka_engine/engine.py",
     "def _cancel(driver, record):\n    return driver.forward(record)"),
    ("takes a partition over", "runtime/faust_engine/engine.py",
     "def _again(self, topic, partition):\n    return self.driver.rebuild(topic, partition, 0)"),
    ("takes a partition over", "runtime/kafka_engine/transaction.py",
     "def _rewind(self, partition):\n    return self.driver.rebuild('e', partition, 0)"),
])
def test_a_second_room_playing_a_role_breaks_it(copy_of_the_package: Path, role: str,
                                                module: str, code: str) -> None:
    """Each role check fails on a violation: another module building a final message (by
    ``Emit`` or from an adapter's ``final``), a ``run.ended`` record, deciding a held call
    (``approve``, ``edit``, ``approval_denied``), calling the producer's transactional API
    (the engine committing past its transaction object), signing a record (the hooks
    signing again), forwarding a control record or taking a partition over outside an
    engine's forwarding or rebalance room is named beside the role's own rooms."""
    package = copy_of_the_package / "worker"
    add_import(package / module, code)
    assert role_players(package, role) == rooms(role) | {module}

# -- the engine/driver line: crossed one way (issue 35) ------------------------------------
#
# The driver returns what the engine must do; it never calls the engine, and nothing commits
# inside it. Checked by watching the calls themselves (``sys.setprofile``) while each engine
# applies records, ticks and takes a partition over, with fake clients: any call into an
# engine's code, or any transaction call (begin, produce, offsets, commit, abort), made while a
# frame of the driver's side (the driver, the takeover, the hold, the partition, the step,
# the core) is on the stack is a crossing. The engine's heads table is the one engine object
# the driver holds: a store it reads and stages writes in (its mapping methods only).

#: Where the driver's side runs: an engine's code must never run beneath these frames.
DRIVER_SIDE = tuple(str(REPO / "worker" / p) for p in (
    "runtime/driver.py", "runtime/takeover.py", "runtime/hold.py", "runtime/partition.py",
    "runtime/step.py", "core"))
#: The engines' code.
ENGINES = tuple(str(REPO / "worker" / "runtime" / e) for e in ("kafka_engine", "faust_engine"))
#: The heads table's mapping methods: the store the driver writes its heads into, staged.
STORE = frozenset({"__getitem__", "__setitem__", "__delitem__", "__iter__", "__len__",
                   "__contains__", "get", "items", "take_pending"})
#: A transaction's calls, the producer's and the engine's own (transaction.py).
TRANSACTIONAL = frozenset({"begin_transaction", "produce", "send_offsets_to_transaction",
                           "commit_transaction", "abort_transaction", "commit", "settle",
                           "abandon", "begin"})


class Crossings:
    """A profile function that notes each crossing of the engine/driver line from below."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        path, name = code.co_filename, code.co_name
        engine = path.startswith(ENGINES) and not (path.endswith("heads.py") and name in STORE)
        transactional = name in TRANSACTIONAL and not path.startswith(DRIVER_SIDE)
        if not (engine or transactional):
            return
        caller = frame.f_back
        while caller is not None:
            if caller.f_code.co_filename.startswith(DRIVER_SIDE):
                below = caller.f_code
                self.found.append(f"{name} ({Path(path).name}) beneath "
                                  f"{below.co_name} ({Path(below.co_filename).name})")
                return
            caller = caller.f_back


class _Producer:
    """A transactional producer that sends nowhere."""

    def __init__(self) -> None:
        self.produced: list[tuple[str, bytes | None]] = []

    def begin_transaction(self) -> None:
        pass

    def produce(self, topic: str, value: bytes | None, key: bytes | None,
                partition: int | None = None, **options: Any) -> None:
        self.produced.append((topic, key))

    def send_offsets_to_transaction(self, *args: Any) -> None:
        pass

    def commit_transaction(self, timeout: float) -> None:
        pass

    def abort_transaction(self, timeout: float) -> None:
        pass


class _Consumer:
    def consumer_group_metadata(self) -> object:
        return object()

    def assignment(self) -> list[Any]:
        return []

    def close(self) -> None:
        pass

    def get_watermark_offsets(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        return 0, 0


def _envelopes(run_id: str) -> list[dict[str, Any]]:
    """A run that commits one call."""
    from builders import chat_calls, chat_run, chat_tool

    tools = [chat_tool("get_weather", {"type": "object"})]
    return chat_run(run_id, tools, chat_calls([("c1", "get_weather", '{"city": "Oslo"}')]))


def _kafka_engine(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, _Producer, list[EngineMessage]]:
    """The kafka engine with fake clients, partition 0 its own, and a run's records."""
    import orjson

    from worker.core import Assembler
    from worker.runtime.config import load_config
    from worker.runtime.kafka_engine import reader
    from worker.runtime.kafka_engine.engine import KafkaEngine
    from worker.runtime.partition import PartitionState

    config = load_config(None, env={"LATCH_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    engine = KafkaEngine(config)  # clients that never connect
    engine.consumer.close()
    producer = _Producer()
    engine.txn.producer = producer  # type: ignore[assignment]
    engine.consumer = _Consumer()  # type: ignore[assignment]
    engine.partitions[0] = PartitionState(Assembler(config.assemble), next_offset=0)
    messages = [EngineMessage(engine.events, n, e["run_id"].encode(), orjson.dumps(e))
                for n, e in enumerate(_envelopes("r1"))]
    monkeypatch.setattr(reader, "read", lambda settings, topic, partition, start, end: [
        m for m in messages if start <= m.offset() < end])
    return engine, producer, messages


def _drive_kafka_engine(engine: Any, messages: list[EngineMessage]) -> None:
    """Apply a run in two ``consume`` calls, tick, commit, take the partition over again
    halfway through the run (its records read back), apply the rest, commit."""
    import time

    half = len(messages) // 2
    engine._apply_events(messages[:half])
    engine._tick(time.monotonic())
    engine._commit()
    engine.partitions[0] = engine._rebuild(0, half)
    engine._apply_events(messages[half:])
    engine._commit()


def test_the_kafka_engine_sends_and_commits_and_the_driver_never_calls_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The kafka engine applies a run that commits a call (two ``consume`` calls), ticks,
    commits, takes the partition over (its open run read back) and commits again: no engine
    code and no transaction call ever runs beneath a frame of the driver's side, and the
    committed call was sent (by the engine, from its own loop)."""
    engine, producer, messages = _kafka_engine(monkeypatch)
    crossings = Crossings()
    sys.setprofile(crossings)
    try:
        _drive_kafka_engine(engine, messages)
    finally:
        sys.setprofile(None)
    assert crossings.found == []
    assert (engine.outputs[_topic("COMMITTED")], b"r1") in producer.produced


def test_an_engine_called_from_inside_the_driver_breaks_the_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is only worth something if it fails: a driver hook that commits the
    engine's transaction (what the registry hold once did, nine frames inside the core) is
    named as a crossing, with the engine's call and the driver's frame beneath it."""
    engine, _, messages = _kafka_engine(monkeypatch)
    traced = engine.driver.hooks.traced

    def traced_and_committed(emits: Any) -> None:  # (a callback into the engine)
        traced(emits)
        engine._commit()

    monkeypatch.setattr(engine.driver.hooks, "traced", traced_and_committed)
    crossings = Crossings()
    sys.setprofile(crossings)
    try:
        _drive_kafka_engine(engine, messages)
    finally:
        sys.setprofile(None)
    assert any(found.startswith("_commit (engine.py) beneath _emitted (driver.py)")
               for found in crossings.found), crossings.found
    assert any(found.startswith("commit (transaction.py)") for found in crossings.found)


def test_the_faust_engine_applies_through_the_driver_which_never_calls_it() -> None:
    """The faust engine's hot path (one record at a time, the records of a run that commits
    a call, then a tick): its sends and its heads writes happen in its own frames, none
    beneath the driver's."""
    import asyncio
    from types import SimpleNamespace

    import orjson

    from worker.core import Assembler
    from worker.core.envelope import TICK_KEY
    from worker.runtime.config import load_config
    from worker.runtime.faust_engine.engine import FaustEngine
    from worker.runtime.partition import PartitionState

    # (the result latch off: the run closes at its final message, its done head written)
    latch = FaustEngine(load_config(None, env={"LATCH_WORKER__WEB_PORT": "0",
                                               "LATCH_RESULTS__ENABLED": "false"}))
    sent: list[Any] = []

    async def publish(state: Any, outs: Any) -> None:
        sent.extend(outs)

    latch.sends.publish = publish  # type: ignore[method-assign]
    latch.staged.store = {}  # type: ignore[assignment]  # (no faust table: no app running)
    latch.partitions[0] = PartitionState(Assembler(latch.config.assemble), next_offset=0)
    envelopes = [*_envelopes("r1"), {"v": 1, "type": "tick", "ts": 2000}]
    messages = [SimpleNamespace(topic="events", partition=0, offset=n, headers=[],
                                key=TICK_KEY.encode() if e["type"] == "tick"
                                else e["run_id"].encode(), value=orjson.dumps(e), timestamp=1.0)
                for n, e in enumerate(envelopes)]

    async def feed() -> None:
        for message in messages:
            rest = latch._step_event(message)
            if rest is not None:
                await rest

    crossings = Crossings()
    sys.setprofile(crossings)
    try:
        asyncio.run(feed())
    finally:
        sys.setprofile(None)
    assert crossings.found == []
    assert any(out.topic.name == "COMMITTED" for out in sent)
    assert latch.staged.store[b"r1"]["done"] is True


def _topic(name: str) -> Any:
    from worker.core import Topic

    return Topic[name]
