"""Building llama-cpp-python safely for this CPU, and proving the build: set-up's llama.cpp step.

Package code (not a script in the clone) so that ``promptlookup setup-llama`` gives any environment
the build a clone's ``scripts/setup.sh`` gives its ``.venv``, through the same code:
:mod:`~promptlookup.llama_build.recipe` says what to build (ISA, kernels, patches, wheelhouse key),
:mod:`~promptlookup.llama_build.installer` builds, installs and smoke-tests it. Both use the standard
library only, and importing this package loads nothing else, so set-up can run it on the system
Python before promptlookup's dependencies exist.
"""
