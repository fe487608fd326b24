"""A real browser: Debian's headless Chromium loads a dapp page from the proxy (same origin as the
RPC paths, over http://localhost, a secure context) whose fetch() calls are JSON-RPC, single and
batched, small and large. The page reports what each answer came with (its Content-Encoding, as
fetch() shows a same-origin response's headers) and its decoded text; each must equal the node's
answer, asked directly. Through nginx and both Envoy adapters; and where the page first fetches
the proxy's dcz dictionary (RFC 9842), every answer comes as dcz, small ones included."""

import html
import json
import re
import shutil
import subprocess

import pytest

from testbed import replay_corpus as rc
from testbed.envoy_harness import COMPRESSION_PLUGIN_CONFIG, ENVOY_HOSTS, EXAMPLE, run_envoy
from testbed.harness import CORPUS, LOOPBACK, free_port
from testbed.nginx_harness import start_nginx

CHROMIUM = shutil.which("chromium") or "chromium: not installed (make test installs Debian's)"

SMALL = "eth_getTransactionByBlockHashAndIndex/erigon-rpc-tests__mainnet__test_02.json"  # 659 B answer
MEDIUM = "erigon_getLatestLogs/erigon-rpc-tests__mainnet__test_10.json"  # 56 KiB
LARGE = "trace_replayTransaction/erigon-rpc-tests__mainnet__test_10.tar"  # 1.5 MiB: streamed

PAGE = """<!doctype html>
<meta charset="utf-8">
<title>dapp</title>
<pre id="out">pending</pre>
<script>
const calls = CALLS;
const dictionary = DICTIONARY;
(async () => {
  if (dictionary) {
    // the proxy's dictionary, which the browser keeps for the paths its Use-As-Dictionary names,
    // a moment after it arrived: the first call is made until it comes back in dcz
    await (await fetch(dictionary)).arrayBuffer();
    const first = calls[0];
    for (let tries = 0; tries < 40; tries++) {
      const response = await fetch(first.path, {method: "POST", headers: {"Content-Type": "application/json"}, body: first.body});
      await response.arrayBuffer();
      if (response.headers.get("content-encoding") === "dcz") break;
      await new Promise(resolve => setTimeout(resolve, 250));
    }
  }
  const results = [];
  for (const call of calls) {
    try {
      const response = await fetch(call.path, {method: "POST", headers: {"Content-Type": "application/json"}, body: call.body});
      results.push({name: call.name, status: response.status, encoding: response.headers.get("content-encoding"),
                    length: response.headers.get("content-length"), text: await response.text()});
    } catch (error) {
      results.push({name: call.name, error: String(error)});
    }
  }
  document.getElementById("out").textContent = JSON.stringify(results);
})();
</script>
"""

NGINX = """
    server {{
        listen {LOOPBACK}:{port};
        rpcedge on;
        location = /dapp.html {{ root {root}; }}
        location = /br/dapp.html {{ root {root}; }}
        location / {{
            proxy_pass http://{LOOPBACK}:{replay_port};
        }}
        location /br/ {{
            rpcedge_encodings br gzip;
            proxy_pass http://{LOOPBACK}:{replay_port}/;
        }}
        location = /dcz/dapp.html {{ root {root}; }}
        location = /dcz/dictionary {{ rpcedge_dictionary "/dcz/*"; }}
        location /dcz/ {{
            rpcedge_encodings dcz zstd gzip br deflate;
            proxy_pass http://{LOOPBACK}:{replay_port}/;
        }}
    }}
"""


def calls(prefix=""):
    """(name, path, body) of each call the page makes: a small answer, a medium and a large one,
    and a batch of the three."""
    requests = {name: rc.read_pairs(CORPUS / path)[0][0] for name, path in
                (("small", SMALL), ("medium", MEDIUM), ("large", LARGE))}
    network = {name: rc.network_of(path) for name, path in (("small", SMALL), ("medium", MEDIUM), ("large", LARGE))}
    made = [(name, f"{prefix}/{network[name]}", rc.compact(request).decode()) for name, request in requests.items()]
    batch = [dict(request, id=100 + i) for i, request in enumerate(requests.values())]
    assert len(set(network.values())) == 1, "the batch goes to one network"
    made.append(("batch", f"{prefix}/{network['small']}", rc.compact(batch).decode()))
    return made


def write_page(directory, prefix="", dictionary=None):
    """The dapp page, which first fetches `dictionary` (a path) where one is given."""
    page = [{"name": name, "path": path, "body": body} for name, path, body in calls(prefix)]
    directory.mkdir(parents=True, exist_ok=True)
    text = PAGE.replace("CALLS", json.dumps(page)).replace("DICTIONARY", json.dumps(dictionary))
    (directory / "dapp.html").write_text(text)


def browse(url, tmp_path):
    """The page's report, once its fetches are done: Chromium holds the DOM dump until the page's
    network fetches are in (virtual time pauses while any is pending)."""
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=30000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="out">(.*?)</pre>', done.stdout, re.S)
    assert found, f"no report in the page (exit {done.returncode}): {done.stdout[-500:]} {done.stderr[-2000:]}"
    return json.loads(html.unescape(found.group(1)))


def check(report, replay, prefix, coding):
    by_name = {result["name"]: result for result in report}
    assert sorted(by_name) == ["batch", "large", "medium", "small"], report
    for name, path, body in calls(prefix):
        result = by_name[name]
        assert "error" not in result and result["status"] == 200, result
        _, _, node = replay.request("POST", path.removeprefix(prefix), body=body.encode())
        assert json.loads(result["text"]) == json.loads(node), f"{name}: the decoded answer is the node's"
        if len(node) < 1024 and coding != "dcz":
            assert result["encoding"] is None, f"{name}: a small answer goes as it is"
        else:
            # with the dictionary, small answers too
            assert result["encoding"] == coding, f"{name}: {result['encoding']}"


@pytest.fixture(scope="module")
def nginx(replay, tmp_path_factory):
    root = tmp_path_factory.mktemp("dapp")
    write_page(root)
    write_page(root / "br", "/br")
    write_page(root / "dcz", "/dcz", dictionary="/dcz/dictionary")
    port = free_port()
    server = start_nginx(tmp_path_factory.mktemp("browser-nginx"),
                         NGINX.format(LOOPBACK=LOOPBACK, port=port, root=root, replay_port=replay.port), [port])
    yield port
    server.stop()


@pytest.mark.parametrize("prefix, coding", [("", "zstd"), ("/br", "br"), ("/dcz", "dcz")])
def test_chromium_gets_zstd_br_or_dcz_through_nginx_and_decodes_the_nodes_answers(nginx, replay, tmp_path, prefix,
                                                                                  coding):
    report = browse(f"http://localhost:{nginx}{prefix}/dapp.html", tmp_path)
    check(report, replay, prefix, coding)


@pytest.mark.parametrize("dictionary", [False, True], ids=["zstd", "dcz"])
@pytest.mark.parametrize("adapter", ENVOY_HOSTS.values())
def test_chromium_gets_zstd_or_dcz_through_envoy_and_decodes_the_nodes_answers(replay, tmp_path, adapter, dictionary):
    write_page(tmp_path / "page", dictionary="/rpcedge/dictionary" if dictionary else None)
    route = '              - match: {path: "/mainnet"}\n'
    page = (f'              - match: {{path: "/dapp.html"}}\n'
            f'                direct_response: {{status: 200, body: {{filename: {tmp_path / "page" / "dapp.html"}}}}}\n'
            f'                response_headers_to_add: [{{header: {{key: content-type, value: text/html}}}}]\n')
    text = EXAMPLE.read_text()
    assert text.count(route) == 1
    (tmp_path / "envoy").mkdir()
    plugin_config = COMPRESSION_PLUGIN_CONFIG
    if dictionary:
        dcz = {"encodings": ["dcz", "zstd", "gzip", "br", "deflate"], "dictionary": {"match": "/*"}}
        plugin_config = plugin_config[:-1] + ", " + json.dumps(dcz)[1:]
    envoy = run_envoy(tmp_path / "envoy", replay.port, plugin_config=plugin_config,
                      text=text.replace(route, page + route), adapter=adapter)
    try:
        report = browse(f"http://localhost:{envoy.port}/dapp.html", tmp_path)
    finally:
        envoy.process.stop()
    check(report, replay, "", "dcz" if dictionary else "zstd")
