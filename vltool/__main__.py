"""`python -m vltool` and `accelerate launch -m vltool` (any directory); a bare vltool as accelerate's script runs
this file only from the repository root, where ./vltool is the package (docs/pretrain.md)."""

if __package__ in (None, ""):  # run as a file path: make the package importable by absolute name
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vltool.cli import main

if __name__ == "__main__":
    main()
