"""What a process that serves the bridge does to itself once the bridge is up."""

from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    """Collect what starting left behind, then keep every object still alive (modules, models'
    schemas, config, connectors: they live as long as the process) out of later collections.

    A full collection walks every tracked object; under load the collector ran one every ~0.2 s,
    and walking the startup objects each time paused the loop for ~15 ms (the p99 of
    `benchmarks/core.py`, and ~10 % of its time). Frozen objects are still freed by reference
    counting; only a cycle among them would never be.
    """
    gc.collect()
    gc.freeze()
