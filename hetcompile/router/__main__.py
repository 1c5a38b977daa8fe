"""`python -m hetcompile.router --table OUT/router/routing.json`: run the bundled router.

The flags, defaults and validation live in `hetcompile.router.options`, shared with `hetcompile router`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from hetcompile.router.options import auth_token_from_env, build_parser, run

__all__ = ["auth_token_from_env", "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
