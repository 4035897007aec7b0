"""What the worker shows of itself, whichever engine runs: metrics (:mod:`.metrics`), the
health and metrics HTTP endpoint (:mod:`.health`), run spans (:mod:`.tracing`), both behind
:mod:`.telemetry`, and JSON logs (:mod:`.logs`). No Kafka client, no faust."""
