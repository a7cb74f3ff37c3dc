"""The tests of multigpu.plots draw off screen."""

import matplotlib

matplotlib.use("Agg")
