"""Run `make test`'s two pytest passes side by side and fail if either fails.

The first pass runs every test on the ext_proc data path (GatewaySettings' default);
the second runs the integration tests whose gateway follows KEG_TEST_DATA_PATH again on
the native one (tests/integration/conftest.py keeps only those), after the first.

`--side-by-side` runs them at the same time, each with its own broker and temporary
directory (the second's output kept in a file and printed whole at the end). Integration
tests mostly wait: the first pass's process tree used 0.06-1.2 cores on a 2-core
machine, and side by side the two used 1-2. But one of two such runs of `make test` on
a fresh clone failed a test that passes alone (a librdkafka consumer of a native
gateway, under the doubled load), so CI runs them one after the other.

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
    parser.add_argument("--side-by-side", action="store_true",
                        help="run the native pass beside the first, not after it")
    options = parser.parse_args(argv)

    first = _pytest("--durations=25")
    native_env = os.environ | {"KEG_TEST_DATA_PATH": "native"}
    with tempfile.TemporaryDirectory(prefix="keg-native-pass-") as scratch:
        # Its own temporary directory and no shared cache file: the two passes write
        # side by side.
        native = _pytest("tests/integration", "--durations=10", "-p", "no:cacheprovider",
                         f"--basetemp={Path(scratch) / 'tmp'}")
        if not options.side_by_side:
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
