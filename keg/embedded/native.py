"""keg's Kafka filter for Envoy (envoy/kafka_filter): where its shared object is, and building it.

`make setup` builds it (`cargo build --release`); `module_dir()` is what Envoy's
`ENVOY_DYNAMIC_MODULES_SEARCH_PATH` must name, and builds the module first when it is
missing or older than its sources (cargo decides what to rebuild).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

from control_plane.native_filter import MODULE_NAME
from keg.paths import REPO_ROOT

log = logging.getLogger(__name__)

CRATE_DIR = REPO_ROOT / "envoy" / "kafka_filter"
MODULE_DIR_ENV = "KEG_NATIVE_MODULE_DIR"
SEARCH_PATH_ENV = "ENVOY_DYNAMIC_MODULES_SEARCH_PATH"


class NativeModuleUnavailable(RuntimeError):
    """The module is not built and cannot be built here."""


def library_name() -> str:
    return f"lib{MODULE_NAME}.so"


def built_library() -> Path:
    return CRATE_DIR / "target" / "release" / library_name()


def _stale(library: Path) -> bool:
    if not library.exists():
        return True
    built = library.stat().st_mtime
    sources = [CRATE_DIR / "Cargo.toml", CRATE_DIR / "Cargo.lock", *CRATE_DIR.glob("src/**/*.rs")]
    return any(p.exists() and p.stat().st_mtime > built for p in sources)


def cargo_binary() -> str:
    """cargo on PATH, else rustup's default place (it may not exist)."""
    return shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")


def build_module(quiet: bool = True) -> Path:
    """`cargo build --release` of the crate; the library's path."""
    cargo = cargo_binary()
    if not Path(cargo).exists():
        raise NativeModuleUnavailable(
            "cargo not found: install Rust (https://rustup.rs) to build keg's Envoy filter, "
            f"or set {MODULE_DIR_ENV} to a directory holding {library_name()}")
    cmd = [cargo, "build", "--release", "--manifest-path", str(CRATE_DIR / "Cargo.toml")]
    if quiet:
        cmd.append("--quiet")
    log.info("building keg's Envoy filter: %s", " ".join(cmd))
    result = subprocess.run(cmd, capture_output=quiet, text=True)
    if result.returncode != 0:
        raise NativeModuleUnavailable(f"cargo build failed:\n{(result.stderr or '')[-3000:]}")
    return built_library()


def module_dir(build: bool = True) -> Path:
    """The directory holding lib<module>.so ($KEG_NATIVE_MODULE_DIR, else the crate's
    release build, built or rebuilt first when `build`)."""
    if env := os.environ.get(MODULE_DIR_ENV):
        directory = Path(env)
        if not (directory / library_name()).exists():
            raise NativeModuleUnavailable(f"{MODULE_DIR_ENV}={env} holds no {library_name()}")
        return directory
    library = built_library()
    if build and _stale(library):
        build_module()
    if not library.exists():
        raise NativeModuleUnavailable(f"{library} is not built: run make setup")
    return library.parent
