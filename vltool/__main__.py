"""`python -m vltool`, `accelerate launch -m vltool` and `accelerate launch vltool` (from the repo root)."""

if __package__ in (None, ""):  # run as a file path: make the package importable by absolute name
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vltool.cli import main

if __name__ == "__main__":
    main()
