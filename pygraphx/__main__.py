"""`python -m pygraphx`: the same command line as `pygraphx-driver` (see `pygraphx.driver`)."""

from __future__ import annotations

from pygraphx.driver.main import main

if __name__ == "__main__":
    raise SystemExit(main())
