"""Real workloads for the benchmarks (issue 41): code edits between two releases of a package,
summaries of papers, and multi-turn agent tasks with executable tools, each built deterministically
from public packages installed from the registry into a cache outside the repository.

Run ``python benchmarks/workloads/real/build.py`` (see README.md beside this file)."""
