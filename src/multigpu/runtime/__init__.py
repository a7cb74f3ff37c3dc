"""Support code a learner may skip: launching ranks, the rank environment, scratch
modules written from a notebook, checkpoints."""
