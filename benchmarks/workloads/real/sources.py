"""Where the data comes from: packages pinned here, fetched from the registry by pip.

- The **site**: ``bfcl-eval`` (the agent tasks and their tool simulators), ``aclsum`` (the papers)
  and ``mpmath`` (which BFCL's math tool imports), installed with ``pip install --no-deps --target``
  into ``<workloads>/site-<hash of the pins>``: bfcl-eval's own dependencies pin an old numpy and
  vendor SDKs that nothing here needs, and no environment of ours is touched.
- The **sdists**: two releases of each package in :data:`RELEASES`, downloaded with
  ``pip download --no-deps --no-binary :all:`` into ``<workloads>/sdists``; the code edits are the
  files that changed between them.

Each step is skipped when its result is already there, so a second build reads the cache only.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from real.common import WorkloadError, workloads_root

SITE_PINS = ("bfcl-eval==2026.3.23", "aclsum==0.1.2", "mpmath==1.3.0")
# package -> (old release, new release): small pure-Python libraries whose sdists hold their sources
RELEASES = {
    "attrs": ("23.2.0", "24.1.0"),
    "humanize": ("4.9.0", "4.10.0"),
    "packaging": ("23.2", "24.0"),
    "platformdirs": ("4.2.0", "4.3.0"),
    "pluggy": ("1.4.0", "1.5.0"),
}
SDIST_SUFFIXES = (".tar.gz", ".zip")


def site_dir(root: Path | None = None, pins: tuple[str, ...] = SITE_PINS) -> Path:
    """The site folder for ``pins``: its name carries their hash, so other pins get another folder."""
    digest = hashlib.sha256("\n".join(pins).encode()).hexdigest()[:12]
    return (root or workloads_root()) / f"site-{digest}"


def site_ready(site: Path, pins: tuple[str, ...] = SITE_PINS) -> bool:
    """Whether ``site`` is a finished install of ``pins`` (PINS.txt is written last)."""
    marker = site / "PINS.txt"
    return marker.is_file() and marker.read_text(encoding="utf-8").split() == list(pins)


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no message)"]
        raise WorkloadError(f"pip {args[0]} failed ({done.returncode}): {tail[0]}")


def prepare_site(root: Path | None = None, pins: tuple[str, ...] = SITE_PINS) -> Path:
    """Install ``pins`` into their site folder once (into a temporary folder renamed into place, so
    a killed install leaves no half site); return the folder."""
    root = root or workloads_root()
    site = site_dir(root, pins)
    if site_ready(site, pins):
        return site
    dl = root / "dl"
    dl.mkdir(parents=True, exist_ok=True)
    _pip("download", "--no-deps", "-d", str(dl), *pins)
    tmp = site.with_name(site.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    _pip("install", "--no-deps", "--no-compile", "--find-links", str(dl), "--target", str(tmp), *pins)
    (tmp / "PINS.txt").write_text("\n".join(pins) + "\n", encoding="utf-8")
    shutil.rmtree(site, ignore_errors=True)
    tmp.rename(site)
    return site


def sdist_path(folder: Path, package: str, version: str) -> Path:
    """The downloaded sdist of ``package==version`` in ``folder`` (either spelling of the name)."""
    names = {package, package.replace("-", "_")}
    for name in sorted(names):
        for suffix in SDIST_SUFFIXES:
            p = folder / f"{name}-{version}{suffix}"
            if p.is_file():
                return p
    raise WorkloadError(f"{folder}: no sdist of {package}=={version} (.tar.gz or .zip)")


def fetch_sdists(root: Path | None = None, releases: dict[str, tuple[str, str]] = RELEASES
                 ) -> dict[str, tuple[Path, Path]]:
    """Download the two sdists of every package in ``releases`` (those not already there); return
    package -> (old sdist, new sdist)."""
    folder = (root or workloads_root()) / "sdists"
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for pkg, versions in sorted(releases.items()):
        pair = []
        for v in versions:
            try:
                pair.append(sdist_path(folder, pkg, v))
            except WorkloadError:
                _pip("download", "--no-deps", "--no-binary", ":all:", "-d", str(folder), f"{pkg}=={v}")
                pair.append(sdist_path(folder, pkg, v))
        out[pkg] = (pair[0], pair[1])
    return out
