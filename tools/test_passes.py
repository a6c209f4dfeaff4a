"""Run `make test`'s two pytest passes side by side and fail if either fails.

The first pass runs every test on the ext_proc data path (GatewaySettings' default);
the second runs the integration tests whose gateway follows KEG_TEST_DATA_PATH again on
the native one (tests/integration/conftest.py keeps only those). Integration tests
mostly wait (on consumer groups, retries, timeouts): the first pass's process tree used
0.06-1.2 cores, about half of one on average, on a 2-core machine. So the passes run at
the same time, each with its own broker and temporary directory; the second's output is
kept in a file and printed whole when both are done, so neither interleaves.

pytest's exit status 5 (no test collected) fails the run: a pass that ran nothing must
never pass silently.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

NO_TESTS_COLLECTED = 5


def _pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", *args]


def _verdict(name: str, code: int) -> bool:
    if code == NO_TESTS_COLLECTED:
        print(f"{name}: pytest collected no tests", flush=True)
        return False
    if code != 0:
        print(f"{name}: failed (pytest exit status {code})", flush=True)
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequential", action="store_true",
                        help="run the native pass after the first, not beside it")
    options = parser.parse_args(argv)

    first = _pytest("--durations=25")
    native_env = os.environ | {"KEG_TEST_DATA_PATH": "native"}
    with tempfile.TemporaryDirectory(prefix="keg-native-pass-") as scratch:
        # Its own temporary directory and no shared cache file: the two passes write
        # side by side.
        native = _pytest("tests/integration", "--durations=10", "-p", "no:cacheprovider",
                         f"--basetemp={Path(scratch) / 'tmp'}")
        if options.sequential:
            passed = _verdict("ext_proc pass", subprocess.call(first))
            print("native pass:", " ".join(native[1:]), flush=True)
            return 0 if _verdict("native pass", subprocess.call(native, env=native_env)) \
                and passed else 1

        log_path = Path(scratch) / "native.log"
        print(f"native pass (beside the first; its output follows it): {' '.join(native[1:])}",
              flush=True)
        with open(log_path, "wb") as log:
            second = subprocess.Popen(native, env=native_env, stdout=log,
                                      stderr=subprocess.STDOUT)
            try:
                first_code = subprocess.call(first)
                second_code = second.wait()
            finally:
                if second.poll() is None:
                    second.terminate()
                    second.wait()
        print("\n======== native pass ========", flush=True)
        sys.stdout.buffer.write(log_path.read_bytes())
        sys.stdout.flush()
        passed = _verdict("ext_proc pass", first_code)
        return 0 if _verdict("native pass", second_code) and passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
