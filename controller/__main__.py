"""Entry point of `instaslice-controller`; wiring only."""

import sys


def main(argv: list[str] | None = None) -> int:
    print("instaslice-controller: not implemented yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
