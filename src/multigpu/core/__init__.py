"""Pure building blocks: no processes, no process groups (01 on)."""
