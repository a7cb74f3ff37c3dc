# The README's two commands are `make lab` and `make test`; everything else is optional.
# Every target sets up .venv first (pinned versions from constraints.txt).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Same thread count everywhere, so stored notebook outputs do not depend on the cores.
# Idle OpenMP threads sleep rather than spin: with the parts of `make test` sharing
# the cores, spinning took CPU time from the ranks (7% longer on three notebooks).
THREADS := OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE PYTHONHASHSEED=0
# The test targets' Pythons collect garbage less often (tests/startup/sitecustomize.py,
# found on PYTHONPATH): a new Python that imports torch spent about a fifth of its
# import in the collector. Not for `make notebooks`: the stored outputs come from
# Python's defaults, and nbval compares them with what these processes print.
# And glibc's malloc asks for huge pages (glibc 2.35 on; older ones ignore it), where
# the kernel grants them on request (transparent_hugepage "madvise" or "always"): a
# rank forked from a forkserver that has imported torch copies its page tables, and
# frees them as it ends, 512 times fewer entries for the heap; the rank-forking tests
# (tests/zero, tests/exercises/test_zero.py, tests/miniddp/test_buckets.py) took 89
# and 93 -> 84 and 81 processor-seconds. Only where memory lies, never what is computed.
TEST_ENV := $(THREADS) PYTHONPATH="$(CURDIR)/tests/startup$${PYTHONPATH:+:$$PYTHONPATH}" \
	GLIBC_TUNABLES="glibc.malloc.hugetlb=1$${GLIBC_TUNABLES:+:$$GLIBC_TUNABLES}"
# Kernels forked from one process that has imported torch (tests/warm_kernels.py):
# about 2 processor-seconds less per notebook; MULTIGPU_COLD_KERNELS=1 starts each anew.
NBVAL := -p tests.warm_kernels --nbval --nbval-current-env \
	--nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 120
LESSONS := $(sort $(wildcard notebooks/[0-9]*.ipynb))
SOLUTIONS := $(sort $(wildcard notebooks/solutions/[0-9]*.ipynb))
NOTEBOOKS := $(LESSONS) $(SOLUTIONS)
# How many parts of `make test` (after lint) run at once, each printed whole when it
# ends; a part that ends lets the next one start, so the 2 cores stay busy until the
# end. The nbval parts first, then the pytest parts: the order every fresh clone ran
# in before JupyterLab's settings were made first (fresh clones of this machine took
# 831 s and 949 s in this order, 903 s with two pytest parts first: the runs' spread).
# Nine at once were no faster and made the timings the notebooks print
# (12's model against measured steps) and the free ports they pick (09) race with
# the other parts. STREAMS=1 runs them one after the other.
STREAMS ?= 5
# pytest in seven parts: the tests that mostly wait on processes (torchrun from a
# shell, restarts, kills, timeouts, the doctor) in two, the exercises' checkers, the
# sharding wrappers, the hand-built wrappers and models, the core and the later
# methods' packages, and the rest. Short parts at the end of the list, so that the
# cores stay busy until the last one ends: a pytest part keeps about two thirds of
# one core busy (pytest-rest: 88 processor-seconds in 140 s), so the last part alone
# leaves the other core idle (as one part, the rest started last and ran alone for
# the last 86 s of a fresh clone's 1322 s).
WAITING_TESTS := tests/faults tests/ddp tests/snapshot
WAITING_TESTS_2 := tests/runtime tests/doctor tests/gpu
EXERCISE_TESTS := tests/exercises
SHARDING_TESTS := tests/zero tests/fsdp tests/fsdp2
MODEL_TESTS := tests/miniddp tests/horovod_api tests/gpt4d tests/cluster
METHOD_TESTS := tests/core tests/ranks tests/dataparallel tests/costmodel \
	tests/tensor_parallel tests/pipeline tests/context_parallel tests/expert_parallel \
	tests/plots
# In the order `make test` starts them.
PYTEST_PARTS := pytest-waiting pytest-waiting-2 pytest-exercises pytest-models \
	pytest-sharding pytest-methods pytest-rest
# The tests marked `alone` time real launches against the clock as a learner's
# machine is checked, with nothing else running (`make doctor`'s limits: 20 s for a
# gloo launch, 25 s for torchrun). Beside the other parts they fail on a busy CI
# machine (load average 11 on 2 cores: the forkserver's launch of 2 ranks took 12 s,
# torchrun's more than 25 s), so `make test` runs them first, on their own (about
# 20 s), and the seven parts run the others.
ALONE_TESTS := tests/doctor
NOT_ALONE := -m "not alone"
# The lessons in two parts, 11-19 and the others (00-10, 20 on), both with their
# re-run and without CPU kernels. In the order `make test` starts them.
LESSONS_LATE := $(sort $(wildcard notebooks/1[1-9]*.ipynb))
LESSONS_EARLY := $(filter-out $(LESSONS_LATE),$(LESSONS))
NBVAL_PARTS := nbval-lessons-late nbval-lessons nbval-default-late nbval-solutions \
	nbval-default-early

.PHONY: setup lab doctor test test-slow test-browser lint bytecode pytest \
	$(PYTEST_PARTS) nbval nbval-native nbval-default $(NBVAL_PARTS) run notebooks \
	bench clean

# JupyterLab's settings for this course, inside .venv (never the user's home): no
# "notified about official Jupyter news?" prompt over a workshop's first notebook.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.d/multigpu.json

setup: $(STAMP) $(LAB_OVERRIDES)

# torch first: on Linux without an NVIDIA GPU, PyTorch's CPU build (190 MB) when its
# index answers within 5 s, else PyPI's wheel (5.5 GB with its CUDA packages), said
# in one line; TORCH=cpu or TORCH=pypi forces either, on a new .venv (docs/gpu.md).
# Then the pins, installed by uv (from PyPI, as pip would: the same versions), which
# downloads, unpacks and compiles to bytecode on every core at once (set-up on a
# fresh clone, 2 cores: 75 s with pip -> 30 s). Where uv cannot be had or fails, pip
# installs them instead, and compileall compiles on every core (skipping, as pip
# does, a file that does not compile: torch ships one written for Python 3.12).
$(STAMP): constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python src/multigpu/doctor/torch_build.py constraints.txt
	$(BIN)/python -m pip install --quiet -c constraints.txt uv && UV_NATIVE_TLS=1 \
		$(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode \
		-c constraints.txt -e ".[dev]" || { \
		echo "set-up: uv did not install the pins; pip installs them instead (slower)"; \
		$(BIN)/python -m pip install --quiet --no-compile -c constraints.txt -e ".[dev]" \
		&& { $(BIN)/python -m compileall -qq -j 0 $(VENV)/lib >/dev/null || true; }; }
	touch $(STAMP)

$(LAB_OVERRIDES): etc/jupyterlab-overrides.json $(STAMP)
	mkdir -p $(dir $@)
	cp $< $@

# Jupyter refuses to run as root (common in containers) unless told it may.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(STAMP) $(LAB_OVERRIDES)
	$(BIN)/jupyter lab $(ROOT_FLAG) notebooks/

# The participant's machine check, a week before the workshop (docs/instructors.md).
doctor: $(STAMP)
	$(BIN)/python -m multigpu.doctor

# The GPU path in one step (docs/gpu.md): the GPU-marked tests, the lessons' GPU
# cells, nccl, DDP on 1 and 2 GPUs, torchrun with the GPUs' utilisation; a report to
# stdout and $(GPU_REPORT). Without a GPU: one line and what it would run, exit 0.
# `make gpu-check PYTHON=python3` uses that Python (torch and pytest installed)
# with PYTHONPATH=src instead of setting up .venv.
GPU_REPORT ?= build/gpu-check.txt
ifeq ($(filter command line environment override,$(origin PYTHON)),)
GPU_PYTHON := $(BIN)/python
GPU_NEEDS := $(STAMP)
else
GPU_PYTHON := $(PYTHON)
GPU_NEEDS :=
endif

.PHONY: gpu-check
gpu-check: $(GPU_NEEDS)
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) -m multigpu.doctor \
		--gpu --report $(GPU_REPORT)

# JupyterLab's settings before the parts: the pytest parts need them, so that the
# parts start in the order of NBVAL_PARTS, then PYTEST_PARTS (on a fresh clone,
# those that do not need them took the streams first while make wrote them). The
# tests marked `alone` before the parts, with the machine to themselves.
test: lint $(LAB_OVERRIDES) bytecode pytest-alone
	@echo "pytest in seven parts, nbval-native in three and nbval-default in two, $(STREAMS) at a time; each prints its report when it ends"
	$(MAKE) --no-print-directory -j$(STREAMS) --output-sync=target \
		$(NBVAL_PARTS) $(PYTEST_PARTS)

# multigpu's modules compiled once, before the parts. Where the shell sets
# PYTHONDONTWRITEBYTECODE (CI machines often do) Python keeps no compiled module, so
# every new Python and every forked rank compiled the modules it imports again (about
# a twentieth of the notebooks' processor time); a learner's Python keeps them anyway.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 src

# ruff, then the import layers of docs/architecture.md (import-linter, pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

pytest: $(STAMP) $(LAB_OVERRIDES)
	$(TEST_ENV) $(BIN)/pytest tests/

# pytest as `make test` runs it: the tests marked `alone`, then seven parts that
# together are every other test. pytest-alone fails where none is marked (exit 5).
pytest-alone: $(STAMP) $(LAB_OVERRIDES)
	$(TEST_ENV) $(BIN)/pytest -m alone $(ALONE_TESTS)

pytest-waiting: $(STAMP) $(LAB_OVERRIDES)
	$(TEST_ENV) $(BIN)/pytest $(NOT_ALONE) $(WAITING_TESTS)

pytest-waiting-2: $(STAMP) $(LAB_OVERRIDES)
	$(TEST_ENV) $(BIN)/pytest $(NOT_ALONE) $(WAITING_TESTS_2)

pytest-exercises: $(STAMP) $(LAB_OVERRIDES)
	$(TEST_ENV) $(BIN)/pytest $(NOT_ALONE) $(EXERCISE_TESTS)

pytest-sharding: $(STAMP) $(LAB_OVERRIDES)
	$(TEST_ENV) $(BIN)/pytest $(NOT_ALONE) $(SHARDING_TESTS)

pytest-models: $(STAMP) $(LAB_OVERRIDES)
	$(TEST_ENV) $(BIN)/pytest $(NOT_ALONE) $(MODEL_TESTS)

pytest-methods: $(STAMP) $(LAB_OVERRIDES)
	$(TEST_ENV) $(BIN)/pytest $(NOT_ALONE) $(METHOD_TESTS)

pytest-rest: $(STAMP) $(LAB_OVERRIDES)
	$(TEST_ENV) $(BIN)/pytest $(NOT_ALONE) tests/ $(addprefix --ignore=,$(WAITING_TESTS) \
		$(WAITING_TESTS_2) $(EXERCISE_TESTS) $(SHARDING_TESTS) $(MODEL_TESTS) \
		$(METHOD_TESTS))

# The tests marked slow too (ten torchrun restarts in a row, rank 0 killed): minutes.
test-slow: $(STAMP)
	MULTIGPU_SLOW=1 $(TEST_ENV) $(BIN)/pytest tests/snapshot tests/faults

# JupyterLab's own Run All on every lesson notebook in headless Chromium, checked
# against the stored outputs as nbval checks them (tests/browser; a table of seconds
# per notebook closes the run). Needs Debian's chromium and chromium-driver; installs
# selenium on demand (constraints-site.txt); skips, saying why, where one is missing.
test-browser: $(STAMP) $(LAB_OVERRIDES)
	-$(BIN)/python -m pip install --quiet -c constraints.txt -c constraints-site.txt selenium
	MULTIGPU_BROWSER=1 $(THREADS) $(BIN)/pytest -p no:randomly -v -rs tests/browser

# Every notebook with this machine's CPU kernels, each followed by a re-run of its
# code cells in reverse order (tests/nbval_rerun.py); then the lessons with no CPU
# kernels (ATEN_CPU_CAPABILITY=default, as on some ARM builds), so that no stored
# output depends on the processor. The solutions print what their lessons' code
# prints, so they run with one kernel set.
nbval: $(STAMP)
	$(MAKE) --no-print-directory -j$(STREAMS) --output-sync=target \
		nbval-native nbval-default-early nbval-default-late

nbval-native: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -p no:randomly -p tests.nbval_rerun \
		--nbval-rerun $(NBVAL) $(NOTEBOOKS)

# nbval-native as `make test` runs it, in three parts that together are every
# notebook.
nbval-lessons: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -p no:randomly -p tests.nbval_rerun \
		--nbval-rerun $(NBVAL) $(LESSONS_EARLY)

nbval-lessons-late: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -p no:randomly -p tests.nbval_rerun \
		--nbval-rerun $(NBVAL) $(LESSONS_LATE)

nbval-solutions: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -p no:randomly -p tests.nbval_rerun \
		--nbval-rerun $(NBVAL) $(SOLUTIONS)

nbval-default: nbval-default-early nbval-default-late

nbval-default-early: $(STAMP)
	ATEN_CPU_CAPABILITY=default $(TEST_ENV) $(BIN)/python -m pytest -p no:randomly \
		$(NBVAL) $(LESSONS_EARLY)

nbval-default-late: $(STAMP)
	ATEN_CPU_CAPABILITY=default $(TEST_ENV) $(BIN)/python -m pytest -p no:randomly \
		$(NBVAL) $(LESSONS_LATE)

# A workshop dry run: execute every notebook into build/ as HTML, change nothing.
run: $(STAMP)
	mkdir -p build
	$(THREADS) $(BIN)/jupyter nbconvert --to html --execute \
		--ExecutePreprocessor.timeout=300 --output-dir build $(NOTEBOOKS)

# Refresh the stored outputs (commit the result). Stored tracebacks are kept to their
# last line (xmode Minimal) so they hold no machine paths; nbval ignores tracebacks.
notebooks: $(STAMP)
	$(THREADS) $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.timeout=300 \
		--ExecutePreprocessor.extra_arguments="--InteractiveShell.xmode=Minimal" \
		$(NOTEBOOKS)
	$(BIN)/python tests/test_notebooks.py --fix  # the metadata JupyterLab writes

# Every bench/*.py script but the check of stored outputs (compare_notebook_outputs.py,
# run after `make notebooks`) and the modules that are no script.
bench: $(STAMP)
	$(THREADS) $(BIN)/python bench/notebook_times.py
	@for f in $(filter-out bench/__init__.py bench/ranks.py bench/notebook_times.py \
		bench/compare_notebook_outputs.py,$(wildcard bench/*.py)); do \
		echo "== $$f"; $(THREADS) $(BIN)/python $$f || exit 1; done

# The course as a static site (optional): build/site/index.html from README, docs/
# and the notebooks' stored outputs; tools installed on demand (constraints-site.txt).
SITE_STAMP := $(VENV)/.site-installed
SITE_TOOLS := sphinx myst-nb sphinx-book-theme jupyter-server-mathjax selenium

.PHONY: site test-site

$(SITE_STAMP): $(STAMP) constraints-site.txt
	$(BIN)/python -m pip install --quiet -c constraints.txt -c constraints-site.txt \
		$(SITE_TOOLS)
	touch $(SITE_STAMP)

site: $(SITE_STAMP)
	$(BIN)/python book/stage.py build/site-src
	$(BIN)/sphinx-build -W --keep-going -q -b html -d build/site-doctrees build/site-src build/site
	@echo "The site: build/site/index.html"

# The built site in headless Chromium (Debian: apt-get install -y chromium chromium-driver).
test-site: site
	MULTIGPU_SITE=1 $(BIN)/pytest -p no:randomly tests/site

clean:
	rm -rf build .pytest_cache .ruff_cache
