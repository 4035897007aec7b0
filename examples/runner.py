"""An example runner: executes the demo's committed calls and publishes their results.

    latch topics create                      # creates tool.calls.results too
    python examples/runner.py                # then, in another terminal: latch demo

Each committed call on ``tool.calls.committed`` runs the function registered under its name
once (a redelivered call is skipped by its idempotency_key), and one record answers it on
``tool.calls.results``, paired by ``tool_call_id``. Ctrl-C stops it. See docs/runner.md for
how an agent loop turns those records into the provider's tool results. With ``signing.keys``
in latch.yaml it runs only what the worker signed (docs/runner.md).
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from worker.client.runner import Runner
from worker.runtime.config import load_config

CAPITALS = {"france": "Paris", "japan": "Tokyo", "kenya": "Nairobi"}


def get_weather(args: dict[str, Any]) -> dict[str, Any]:
    return {"location": args.get("location"), "forecast": "sunny", "celsius": 21}


def get_capital(args: dict[str, Any]) -> str:
    country = str(args.get("country", ""))
    return CAPITALS.get(country.lower(), f"no capital known for {country}")


def get_stock_price(args: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError("the quotes service is down")  # becomes an error result


def write_items(args: dict[str, Any]) -> dict[str, Any]:
    return {"written": len(args.get("operations", []))}


def glob_search(args: dict[str, Any]) -> list[str]:
    return []  # an example: no file system to search


#: The demo's tool names (examples/demo.jsonl) and the functions that answer them.
TOOLS = {"get_weather": get_weather, "GetWeatherArgs": get_weather,
         "get_capital": get_capital, "get_stock_price": get_stock_price,
         "writeItems": write_items, "glob_search": glob_search}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    runner = Runner(load_config(), TOOLS, group_id="latch-example-runner")
    try:
        handled = runner.run(stop)
    finally:
        runner.close()
    print(f"{handled} records handled, {runner.executed} tool executions")


if __name__ == "__main__":
    main()
