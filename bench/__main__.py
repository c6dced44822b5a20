"""``make bench``: run every benchmark in this folder and print figures next to baselines."""

import sys


def main() -> int:
    print("no benchmarks yet")
    return 0


if __name__ == "__main__":
    sys.exit(main())
