"""Entry point of `instaslice-kubelet-plugin`; wiring only."""

import sys


def main(argv: list[str] | None = None) -> int:
    print("instaslice-kubelet-plugin: not implemented yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
