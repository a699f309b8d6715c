# Two commands on a fresh machine: `make demo` and `make test`. Each installs what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test browser test-unprivileged test-rootless test-cgroup2 test-image test-compose test-cluster \
	test-integrations check docs bench image \
	deps lock clean

deps:
	@# libseccomp (the syscall filter) is the one system library the sandbox needs.
	@ldconfig -p | grep -q 'libseccomp\.so\.2' || { \
	  echo "installing libseccomp2"; apt-get update -qq && apt-get install -y -qq libseccomp2; }
	@# A C compiler and the static C library: the image build compiles the jail's init and
	@# the program's contain steps (src/execbox/sandbox/native).
	@{ command -v cc >/dev/null && test -e "$$(cc -print-file-name=libc.a)"; } || { \
	  echo "installing gcc and libc6-dev"; apt-get update -qq && apt-get install -y -qq gcc libc6-dev; }
	@# e2fsprogs' mke2fs: the jail mounts each environment from an ext4 file made from its tree.
	@{ command -v mke2fs >/dev/null || test -x /sbin/mke2fs || test -x /usr/sbin/mke2fs; } || { \
	  echo "installing e2fsprogs"; apt-get update -qq && apt-get install -y -qq e2fsprogs; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "execbox needs Python 3.11+ as $(PYTHON)"; exit 2; }

$(STAMP): pyproject.toml | deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,integrations]'
	touch $@

image: $(STAMP)
	$(BIN)/execbox image build

demo: image
	$(BIN)/execbox run examples/demo.py --input examples/sales.csv --artifacts-dir artifacts

browser:
	@# Debian's Chromium, which the console's browser tests drive through Playwright
	@# (tests/console); never Playwright's own browser download.
	@command -v chromium >/dev/null || { \
	  echo "installing chromium"; apt-get update -qq && apt-get install -y -qq chromium; }

# The parallel phase's workers (pytest-xdist); `make test TEST_WORKERS=0` runs it in-process.
TEST_WORKERS ?= 3

test: image browser
	@# Two phases: every test not marked `serial` on TEST_WORKERS workers (a test file stays on
	@# one worker), then the `serial` ones (timing claims, whole-machine and hostile-load tests)
	@# alone. Both always run; either failing fails. pytest's 5 is "no tests were collected":
	@# never a pass for a phase.
	@status=0; \
	for phase in parallel serial; do \
	  if [ $$phase = parallel ]; then args=(-n $(TEST_WORKERS) --dist loadfile -m "not serial"); \
	  else args=(-p no:xdist -m serial); fi; \
	  echo "make test: $$phase phase"; \
	  $(BIN)/python -m pytest -q --durations=25 "$${args[@]}"; code=$$?; \
	  if [ $$code -eq 5 ]; then echo "make test: the $$phase phase collected no tests" >&2; code=1; fi; \
	  if [ $$code -ne 0 ]; then echo "make test: the $$phase phase failed ($$code)" >&2; status=$$code; fi; \
	done; \
	exit $$status

test-cluster: image
	@# execbox on a real 3-node Ray cluster (tests/cluster), in a network namespace of its own
	@# with only lo up: Ray dials 8.8.8.8 to find its address otherwise (see the conftest).
	$(BIN)/pip install -q -e '.[dev,cluster]'
	EXECBOX_CLUSTER_TESTS=1 unshare -n sh -c 'ip link set lo up && \
	  exec $(BIN)/python -m pytest -q -p no:cacheprovider --durations=10 tests/cluster'

test-integrations: image
	@# The agent-framework plugs (tests/integrations) with their frameworks installed: a
	@# framework missing is a failure here, not a skip.
	$(BIN)/pip install -q -e '.[dev,integrations]'
	EXECBOX_REQUIRE_INTEGRATIONS=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/integrations

test-unprivileged: $(STAMP)
	@# The tests above the sandbox boundary, as nobody: no root, no image.
	.ci/unprivileged

test-rootless: image
	@# Rootless mode as a throwaway ordinary user the tests make (useradd) and remove: root runs
	@# them, to make that user and the cgroup v1 directories it hands over. newuidmap and
	@# newgidmap (Debian's uidmap) map runs to the subordinate ids a test gives that user.
	@{ command -v newuidmap >/dev/null && command -v newgidmap >/dev/null; } || { \
	  echo "installing uidmap"; apt-get update -qq && apt-get install -y -qq uidmap; }
	$(BIN)/python -m pytest -q -p no:cacheprovider -m rootless tests/rootless

test-image: $(STAMP)
	@# The server's container image (deploy/Containerfile), built with podman and smoke-tested.
	@{ command -v podman >/dev/null && command -v mmdebstrap >/dev/null && command -v runc >/dev/null; } || { \
	  echo "installing podman and mmdebstrap"; apt-get update -qq && \
	  apt-get install -y -qq podman mmdebstrap uidmap runc; }
	tests/image/run

test-compose: test-image
	@# deploy/compose.yaml with podman-compose: PostgreSQL's image built here from Debian's
	@# package, the server's from test-image, the API smoke tests, the records read back.
	@command -v podman-compose >/dev/null || { \
	  echo "installing podman-compose"; apt-get update -qq && apt-get install -y -qq podman-compose; }
	tests/image/compose

test-cgroup2: image
	@# The cgroup tests inside a user-mode Linux kernel with cgroup v2 alone (the host's
	@# hierarchy is left alone): its own time budget, EXECBOX_UML_BUDGET_S.
	tests/uml/boot

check: $(STAMP)
	$(BIN)/ruff check src tests bench docs/hooks
	$(BIN)/ruff format --check src tests bench docs/hooks
	$(BIN)/mypy

docs: $(STAMP)
	@# Strict: a broken link, anchor or reference fails the build. The HTTP reference is
	@# rendered from the server's OpenAPI document (docs/hooks/openapi.py).
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench: image
	$(BIN)/python bench/latency.py

lock: $(STAMP)
	$(BIN)/pip install -q pip-tools
	cd src/execbox/runtime && ../../../$(BIN)/pip-compile --quiet --generate-hashes \
	  --no-strip-extras --no-emit-index-url --no-emit-find-links \
	  --output-file requirements.lock requirements.in

clean:
	rm -rf $(VENV) artifacts bench/results site
