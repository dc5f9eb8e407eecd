"""``python -m promptlookup.llama_build``: set-up's entry point (standard library only)."""

import sys

from promptlookup.llama_build.installer import main

sys.exit(main())
