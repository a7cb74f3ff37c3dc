"""What happened, and when, in ``events.jsonl``: for measuring a restart (11)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

EVENTS_FILE = "events.jsonl"  # one JSON object per line: what happened, and when
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"  # set by torchrun: 0, then 1, 2, ...


def record_event(folder: str | os.PathLike, event: str, **details: Any) -> None:
    """Append ``{"event": ..., "time": ..., "restart": ..., **details}`` as one line
    to ``folder/events.jsonl`` (11). A short append is atomic, so ranks can share
    the file."""
    entry = {
        "event": event,
        "time": time.time(),
        "restart": int(os.environ.get(RESTART_COUNT, "0")),
        **details,
    }
    with open(Path(folder) / EVENTS_FILE, "a", encoding="utf-8") as file:
        file.write(json.dumps(entry) + "\n")


def read_events(folder: str | os.PathLike) -> list[dict[str, Any]]:
    """The events recorded in ``folder``, in the order they were written (11)."""
    path = Path(folder) / EVENTS_FILE
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def restart_figures(
    folder: str | os.PathLike, killed_at: float | None = None
) -> dict[str, float]:
    """How the first restart went, from the events of ``folder`` (11):
    ``detect_s`` (from the kill until a surviving rank's collective failed, or
    torchrun stopped it),
    ``restart_s`` (until the new processes started), ``resume_s`` (until they had
    loaded the snapshot and were ready to train), all in seconds, and
    ``steps_lost`` (steps done before the kill and done again after it).

    ``killed_at``: when the rank was killed (``time.time()``), for a kill from
    outside; an injected :class:`Fault` records it itself.
    """
    events = read_events(folder)
    if killed_at is None:
        kills = [e for e in events if e["event"] == "kill"]
        if not kills:
            raise ValueError(
                "No kill is recorded in this folder. Pass killed_at=time.time() "
                "taken when you killed the rank."
            )
        killed_at = kills[0]["time"]

    def first(event: str, restarted: bool) -> dict[str, Any]:
        for entry in events:
            if entry["event"] == event and entry["time"] >= killed_at:
                if not restarted or entry["restart"] > 0:
                    return entry
        raise ValueError(f"No {event!r} event after the kill: did the run restart?")

    resumed = first("resumed", restarted=True)
    done_before = [
        e["global_step"] for e in events if e["event"] == "step" and e["restart"] == 0
    ]
    return {
        "detect_s": first("failed", restarted=False)["time"] - killed_at,
        "restart_s": first("started", restarted=True)["time"] - killed_at,
        "resume_s": resumed["time"] - killed_at,
        "steps_lost": max(done_before, default=0) - resumed["global_step"],
    }
