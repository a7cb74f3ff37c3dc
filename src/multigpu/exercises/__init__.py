"""Exercise checkers: each runs the learner's code against the reference and names
the mistake it finds (08 on)."""
