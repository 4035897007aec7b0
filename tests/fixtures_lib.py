"""Helpers for the conformance tests over recorded provider streams.

The recorded streams live outside the repository, in ``<clone>/../shared/fixtures/providers/``
(copied verbatim from the test suites of public SDKs; each folder keeps its source repository's
LICENSE beside the files, and the tests read them in place). :data:`FIXTURES` locates that
directory; :func:`fixture` turns a missing directory or file into a test *failure* with a clear
message, never a skip, so that a CI job without the fixtures cannot pass by testing nothing.

:func:`run_capture` runs a capture through exactly the code path of
``latch assemble --from-sse PROVIDER --tools FILE CAPTURE``:
:func:`worker.tools.capture.provider_events`,
:func:`worker.tools.capture.envelopes`, then :meth:`worker.core.Assembler.feed_record` on each
envelope's JSON bytes, and returns the output lines (``{"topic", "key", "value"}``).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

from worker.core import Assembler, AssembleSettings
from worker.tools import capture

FIXTURES = Path(__file__).resolve().parents[1] / ".." / "shared" / "fixtures" / "providers"

OPENAI_PY = "openai-python/.inline-snapshot/external"
ANTHROPIC_PY = "anthropic-sdk-python/tests"
VERCEL = "vercel-ai/packages"
PYDANTIC = "pydantic-ai/tests/models/cassettes"

#: The Responses API events that end one model response (one gateway run each).
RESPONSES_TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def contract_key(*parts: str) -> str:
    """An idempotency key as the contract spells it: the parts joined by ``:``, each with its
    own ``%`` and ``:`` percent-encoded (docs/contract.md, "The contract")."""
    return ":".join(p.replace("%", "%25").replace(":", "%3A") for p in parts)


def fixture(relative: str) -> Path:
    """The path of a recorded stream; fails the calling test when it is not there."""
    if not FIXTURES.is_dir():
        pytest.fail(
            f"provider fixtures not found at {FIXTURES.resolve()}: the conformance tests need "
            "the shared fixtures checked out beside the clone (<clone>/../shared/fixtures/"
            "providers/)", pytrace=False)
    path = FIXTURES / relative
    if not path.is_file():
        pytest.fail(f"provider fixture missing: {path.resolve()}", pytrace=False)
    return path


def load_events(path: Path) -> list[dict[str, Any]]:
    """The provider events of a capture, read as ``latch assemble --from-sse`` reads them;
    the fixtures used with this helper hold no unreadable payload (asserted)."""
    events, _done = capture.provider_events(path.read_text(encoding="utf-8"), str(path))
    readable = [e for e in events if isinstance(e, dict)]
    assert len(readable) == len(events), f"{path.name} holds unreadable payloads"
    return readable


def run_events(
    provider: str, events: Sequence[dict[str, Any]], tools: list[Any],
    settings: AssembleSettings | None = None, run_id: str = "capture",
    assembler: Assembler | None = None,
) -> list[dict[str, Any]]:
    """Feed one run (run.start, the events, stream.end) through an assembler; return lines,
    ending with the summaries of late events that ``latch assemble`` writes at the end of its
    input (``Assembler.summarise_late``)."""
    assembler = assembler or Assembler(settings)
    lines: list[dict[str, Any]] = []
    for envelope in capture.envelopes(provider, list(events), tools, run_id=run_id):
        record = envelope if isinstance(envelope, bytes) else orjson.dumps(envelope)
        emits = assembler.feed_record(None, record.strip())
        lines += [e.as_line() for e in emits]
    return lines + [e.as_line() for e in assembler.summarise_late()]


def run_capture(
    provider: str, path: Path, tools: list[Any], settings: AssembleSettings | None = None,
    run_id: str = "capture",
) -> list[dict[str, Any]]:
    """Run a whole capture as one run, exactly as ``latch assemble --from-sse`` does (a
    cassette of several interactions is one run per interaction there: ``split_responses``)."""
    return run_events(provider, load_events(path), tools, settings, run_id)


def split_responses(events: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Cut a capture of several Responses API responses after each terminal event."""
    runs: list[list[dict[str, Any]]] = [[]]
    for event in events:
        runs[-1].append(event)
        if event.get("type") in RESPONSES_TERMINAL:
            runs.append([])
    return [run for run in runs if run]


def topic(lines: Iterable[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The values emitted on one topic, in emission order."""
    return [line["value"] for line in lines if line["topic"] == name]


def summary(lines: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """(topic, id, name, index, arguments-or-reason) of each outcome record, in order."""
    out: list[tuple[Any, ...]] = []
    for line in lines:
        v = line["value"]
        if line["topic"] == "committed":
            out.append(("committed", v["call_id"], v["name"], v["index"], v["arguments"]))
        elif line["topic"] == "errors":
            out.append(("error", v["tool_call_id"], v["name"], v["index"], v["reason"]))
    return out


def only_final(lines: Sequence[dict[str, Any]]) -> dict[str, Any]:
    finals = topic(lines, "final")
    assert len(finals) == 1, f"expected one final record, got {len(finals)}"
    return finals[0]


def message_call_ids(provider: str, final: dict[str, Any]) -> list[str]:
    """The client tool call ids the final message holds, in message order (all choices)."""
    if provider == "openai.chat":
        messages = [final["message"]] + [c["message"] for c in (final.get("choices") or [])[1:]]
        return [tc["id"] for m in messages for tc in m.get("tool_calls") or ()]
    if provider == "anthropic.messages":
        return [b["id"] for b in final["message"]["content"] if b.get("type") == "tool_use"]
    if provider == "bedrock.converse":
        return [b["toolUse"]["toolUseId"] for b in final["message"]["content"]
                if "toolUse" in b and b["toolUse"].get("type", "tool_use") == "tool_use"]
    if provider == "google.gemini":
        messages = [c["message"] for c in final.get("choices") or [{"message": final["message"]}]]
        return [p["functionCall"]["id"] for m in messages for p in m["parts"]
                if "functionCall" in p]
    return [i["call_id"] for i in final["message"]["output"] if i.get("type") == "function_call"]


def check_run(provider: str, lines: Sequence[dict[str, Any]], run_id: str = "capture") -> None:
    """The invariants every finished run keeps, whatever its calls' outcomes.

    * nothing went to the DLQ, and every record is keyed by the run id;
    * the final record comes last, once;
    * every call has exactly one outcome record (committed or error), and the final record's
      ``outcomes`` list those same calls, in the same order, with the same state and reason;
    * those ids are exactly the client tool call ids of the final message;
    * outcomes are emitted in provider order (``choice``, then ``index``);
    * no error ``content`` repeats the call's argument text.
    """
    assert not topic(lines, "dlq"), topic(lines, "dlq")
    assert all(line["key"] == run_id for line in lines)
    assert lines and lines[-1]["topic"] == "final"
    final = only_final(lines)
    assert final["run_id"] == run_id and final["provider"] == provider
    assert final["idempotency_key"] == contract_key(run_id, "final")
    records = [line for line in lines if line["topic"] in ("committed", "errors")]
    seen = []
    for line in records:
        value = line["value"]
        if line["topic"] == "committed":
            assert value["idempotency_key"] == contract_key(run_id, value["call_id"])
            seen.append((value["call_id"], value["name"], value["index"], "committed", None))
        else:
            assert value["is_error"] is True and value["state"] in ("failed", "cancelled")
            assert value["content"].startswith(f"{value['reason']}: ")
            seen.append((value["tool_call_id"], value["name"], value["index"], value["state"],
                         value["reason"]))
    outcomes = [(o["tool_call_id"], o["name"], o["index"], o["state"], o.get("reason"))
                for o in final["outcomes"]]
    assert seen == outcomes
    ids = [s[0] for s in seen]
    assert len(set(ids)) == len(ids), f"a call id has more than one outcome: {ids}"
    assert sorted(ids) == sorted(message_call_ids(provider, final))
    order = [(o.get("choice", 0), o["index"]) for o in final["outcomes"]]
    assert order == sorted(order)


def tools_json(tools: list[Any]) -> bytes:
    return orjson.dumps(tools)


def load_bench(name: str) -> ModuleType:
    """The benchmark script ``bench/<name>.py`` of this checkout, imported as a module (under
    ``<name>_under_test``) so that unit tests can reach its functions."""
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module by name
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module
