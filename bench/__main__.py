"""`python -m bench`: the benchmark suite (see `bench.suite`)."""

from bench.suite import main

if __name__ == "__main__":
    raise SystemExit(main())
