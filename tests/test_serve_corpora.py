"""``/v1/corpora`` and the per-request ``corpora`` field against a real server process (the bundled
model): add from an allowed root (built in a child process, usable when the call returns), list,
delete (deferred while a stream drafts from it), and hostile input -- paths outside the roots, a
symbolic link out of one, unknown names, a corrupt index, no key -- each a 4xx, never a 5xx."""

from __future__ import annotations

import threading

import httpx
import pytest
from conftest import requires_model
from serving import ServerProcess, server_env

KEY = "corpora-test-key"
CODE = ("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
        "def mul(a, b):\n    return a * b\n")
MESSAGES = [{"role": "user", "content": "Repeat this code exactly:\n" + CODE}]

pytestmark = [pytest.mark.model, requires_model]


@pytest.fixture(scope="module")
def corpus_server(tmp_path_factory):
    base = tmp_path_factory.mktemp("corpora")
    root, outside, cdir = base / "root", base / "outside", base / "cdir"
    for d in (root / "src", outside, cdir):
        d.mkdir(parents=True)
    (root / "src" / "ops.py").write_text(CODE)
    (root / "src" / ".gitignore").write_text("*.tmp\n")
    (root / "corrupt.plsa").write_bytes(b"PLSUFIDX" + b"\0" * 200)
    (outside / "secret.py").write_text("TOKEN = 'x'\n")
    (root / "escape").symlink_to(outside)
    with ServerProcess("--speculate", "suffix", "--parallel", "2", "--corpus-root", str(root),
                       "--corpus-dir", str(cdir), "--api-key", KEY, env=server_env()) as server:
        client = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=300)
        yield server, client, root, outside
        client.close()


def _error(r: httpx.Response) -> dict:
    return r.json()["error"]


def test_add_list_use_delete(corpus_server) -> None:
    import openai

    server, client, root, _ = corpus_server
    assert client.get("/v1/corpora").json()["data"] == []
    r = client.post("/v1/corpora", json={"name": "ops", "path": str(root / "src")})
    assert r.status_code == 201, r.text
    info = r.json()
    assert (info["name"], info["files"], info["state"], info["in_use"]) == ("ops", 2, "ready", 0)
    assert info["tokens"] > 0
    listed = client.get("/v1/corpora").json()["data"]
    assert [c["name"] for c in listed] == ["ops"] and listed[0]["bytes"] > 0

    oa = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY)
    off = oa.chat.completions.create(model="x", messages=MESSAGES, max_tokens=40, temperature=0,
                                     extra_body={"speculate": "off"})
    named = oa.chat.completions.create(model="x", messages=MESSAGES, max_tokens=40, temperature=0,
                                       extra_body={"corpora": ["ops"]})
    assert named.choices[0].message.content == off.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="no corpus named 'nope'"):
        oa.chat.completions.create(model="x", messages=MESSAGES, max_tokens=4,
                                   extra_body={"corpora": ["nope"]})

    # a delete while a stream drafts from the corpus waits for it; the stream ends whole
    got: dict = {}

    def stream() -> None:
        body = {"prompt": CODE, "max_tokens": 64, "temperature": 0, "stream": True, "corpora": ["ops"]}
        with client.stream("POST", "/v1/completions", json=body) as s:
            got["status"] = s.status_code
            got["lines"] = [x for x in s.iter_lines() if x.startswith("data: ")]

    t = threading.Thread(target=stream)
    t.start()
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not client.get("/v1/corpora").json()["data"][0]["in_use"]:
        time.sleep(0.02)
    d = client.delete("/v1/corpora/ops")
    assert d.status_code == 200 and d.json() == {"name": "ops", "deleted": True, "deferred": True}
    t.join(120)
    assert got["status"] == 200 and got["lines"][-1] == "data: [DONE]"
    assert client.get("/v1/corpora").json()["data"] == []
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "corpora": ["ops"]})
    assert r.status_code == 400 and _error(r)["param"] == "corpora"
    assert client.delete("/v1/corpora/ops").status_code == 404


@pytest.mark.parametrize(("body", "status", "needle"), [
    ({"name": "o", "path": "/etc"}, 403, "outside"),
    ({"name": "o", "path": "ESCAPE"}, 403, "outside"),
    ({"name": "o", "path": "ROOT/../outside"}, 403, "outside"),
    ({"name": "o", "path": "ROOT/missing"}, 400, "does not exist"),
    ({"name": "../x", "path": "ROOT/src"}, 400, "corpus name"),
    ({"name": "o", "path": "ROOT/corrupt.plsa"}, 400, "corrupt"),
    ({"name": "o", "path": "ROOT/a\u0000b"}, 400, "NUL"),
    ({"name": 5, "path": "ROOT/src"}, 400, "name"),
    ({"path": "ROOT/src"}, 400, "name"),
])
def test_hostile_adds(corpus_server, body: dict, status: int, needle: str) -> None:
    _, client, root, _ = corpus_server
    if isinstance(body.get("path"), str):
        path = body["path"].replace("ESCAPE", str(root / "escape")).replace("ROOT", str(root))
        body = {**body, "path": path}
    r = client.post("/v1/corpora", json=body)
    assert r.status_code == status, r.text
    assert needle in _error(r)["message"]


def test_key_and_bad_request_fields(corpus_server) -> None:
    server, client, root, _ = corpus_server
    assert httpx.get(server.url + "/v1/corpora").status_code == 401
    assert httpx.post(server.url + "/v1/corpora", json={"name": "a", "path": str(root)}).status_code == 401
    for bad in ("ops", [1], ["a"] * 9, ["x" * 65]):
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "corpora": bad})
        assert r.status_code == 400, (bad, r.text)
    assert client.delete("/v1/corpora/..%2Fx").status_code == 404
