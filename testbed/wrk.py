"""wrk runs whose Lua script (loadtest/wrk/) ends with one line of JSON, `RESULT {...}`."""

import json
import subprocess


def run_wrk(args, seconds):
    """wrk with `args` (a run of `seconds`): (the RESULT's JSON, wrk's whole output); a
    RuntimeError when wrk fails, outlives its run by a minute, or prints no RESULT."""
    done = subprocess.run(["wrk", *map(str, args)], capture_output=True, text=True, timeout=seconds + 60)
    line = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(line[len("RESULT "):]), done.stdout
