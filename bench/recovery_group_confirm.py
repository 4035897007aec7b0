"""The proposed "group confirm" change to ``worker/runtime/faust_engine/engine.py`` as a
prelude, to measure it without editing the worker (docs/recovery.md, "Proposed changes"):

    python bench/bench_recovery.py --prelude bench/recovery_group_confirm.py

A finished run's ``done`` head waits until the partition's sends are known delivered
(checked without waiting at each record), or ``_GMAX`` runs wait, or the partition's next
tick; then one confirm serves all of them. Today the worker waits for a broker round trip
after every finished run. Stale once the change is in
``worker/runtime/faust_engine/engine.py``. Not a module: it is pasted into worker B's ``-c``
code after the benchmark's instrumentation.
"""
import worker.runtime.faust_engine.engine as _gapp
from worker.core import Topic as _GTopic

_GPENDING = {}
_GMAX = 256


async def _g_flush(self, state, partition):
    pend = _GPENDING.pop(id(state), [])
    if not pend:
        return
    await state.confirm()
    for run_id, at in pend:
        seq, status = state.assembler.finished(run_id) or (None, None)
        key = run_id.encode()
        self.heads[key] = {"p": partition, "done": True, "seq": seq, "status": status, "at": at}
        state.done.append((at, key))


async def _g_record_finished(self, state, partition, emits):
    finished = [e.key for e in emits if e.topic is _GTopic.FINAL and e.key is not None]
    if not finished:
        return
    pend = _GPENDING.setdefault(id(state), [])
    pend.extend((run_id, state.clock_ms) for run_id in finished)
    if len(pend) >= _GMAX or all(f.done() for f in state.unconfirmed):
        await _g_flush(self, state, partition)


_g_orig_process = _gapp.FaustEngine._process


async def _g_process(self, state, record):
    await _g_orig_process(self, state, record)
    if record[0] == _gapp.TICK:
        await _g_flush(self, state, record[3]["partition"])


_gapp.FaustEngine._record_finished = _g_record_finished
_gapp.FaustEngine._process = _g_process
