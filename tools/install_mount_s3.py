#!/usr/bin/env python3
"""Build and install mountpoint-s3's `mount-s3` (a peer of tools/bench/bench_remote.py --peers) from its source.

crates.io has no crate that ships the `mount-s3` binary: `mountpoint-s3` there is a 0.0.1 placeholder, and the
published library `mountpoint-s3-fs` has no binaries (its `mount_from_config` example needs a manifest). The
CLI crate (`mountpoint-s3/` in the upstream repository, `publish = false`) is a thin layer over the published
crates, so it is built here on its own: its directory is taken from a checkout of the upstream repository at a
release tag, its workspace dependencies are pointed at the crates.io releases named in the root Cargo.toml of
that tag (`=` versions of `mountpoint-s3-fs` and `mountpoint-s3-client`, which bring the CRT sources with them),
its dev-dependencies are dropped, and the tag's own Cargo.lock pins every other crate (the sibling crates that
the CLI does not name, `mountpoint-s3-crt`, `-crt-sys` and `-fuser`, resolve to their newest compatible patch
release: for v1.23.0, crt-sys 0.17.1 where the tag has 0.17.0). The release profile of the tag is kept (fat
LTO, one codegen unit) without debug info. Then

    cargo install --locked --root ROOT --path BUILD/mountpoint-s3 --bin mount-s3

    python3 tools/install_mount_s3.py --src /path/to/mountpoint-s3[.git] [--rev v1.23.0] \
        [--root ~/.cache/xpackfs/mountpoint-s3] [--target-dir DIR]

--src is a work tree or a git directory (bare is fine) of https://github.com/awslabs/mountpoint-s3. Needs
cargo, a C compiler and cmake (the CRT), libclang (apt libclang-dev, for bindgen) and libfuse3-dev. Prints the
installed binary's path (`mount-s3 --version`: 1.23.0-unofficial). v1.23.0 (mountpoint-s3-fs 0.10.0,
mountpoint-s3-client 0.21.0) builds with rustc 1.95 in about 11 minutes on 2 cores at nice 19 beside a CI run.
"""
from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

DEFAULT_ROOT = Path.home() / ".cache/xpackfs/mountpoint-s3"
DEFAULT_REV = "v1.23.0"


def installed(root: Path = DEFAULT_ROOT) -> Path | None:
    exe = root / "bin" / "mount-s3"
    return exe if exe.exists() else None


def _git(src: Path) -> list[str]:
    return ["git", "--git-dir", str(src / ".git")] if (src / ".git").exists() else ["git", "--git-dir", str(src)]


def export(src: Path, rev: str, dest: Path) -> None:
    """The tag's mountpoint-s3/ directory, Cargo.toml and Cargo.lock into dest."""
    git = _git(src)
    tar = subprocess.run(git + ["archive", "--format=tar", rev, "mountpoint-s3", "Cargo.toml", "Cargo.lock"],
                         capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(dest, filter="data")


def standalone_manifest(crate_toml: str, root_toml: str) -> str:
    """The CLI crate's manifest with its workspace dependencies at their crates.io versions, no dev-dependencies,
    and the workspace's release profile (without debug info) in a workspace of its own."""
    versions = dict(re.findall(r'^(mountpoint-s3-[a-z-]+) = \{ version = "([^"]+)"', root_toml, re.M))

    def dep(m: re.Match) -> str:
        name = m.group(1)
        if name not in versions:
            raise SystemExit(f"no version for {name} in the root Cargo.toml")
        return f'{name} = "={versions[name]}"'

    out = re.sub(r"^(mountpoint-s3-[a-z-]+) = \{ workspace = true \}", dep, crate_toml, flags=re.M)
    # Drop [dev-dependencies] (path dependencies on sibling crates) up to the next table.
    out = re.sub(r"^\[dev-dependencies\]\n.*?(?=^\[)", "", out, flags=re.M | re.S)
    prof = re.search(r"^\[profile\.release\]\n(.*?)(?=^\[|\Z)", root_toml, re.M | re.S)
    body = prof.group(1) if prof else "opt-level = 3\n"
    body = re.sub(r"^debug = .*\n", "", body, flags=re.M)
    return out.rstrip("\n") + "\n\n[workspace]\n\n[profile.release]\n" + body


def build(src: Path, rev: str, root: Path, target_dir: Path | None, work: Path) -> Path:
    export(src, rev, work)
    crate = work / "mountpoint-s3"
    root_toml = (work / "Cargo.toml").read_text()
    (crate / "Cargo.toml").write_text(standalone_manifest((crate / "Cargo.toml").read_text(), root_toml))
    shutil.copyfile(work / "Cargo.lock", crate / "Cargo.lock")
    env = dict(os.environ)
    if target_dir:
        env["CARGO_TARGET_DIR"] = str(target_dir)
    # The tag's lock lists the sibling crates as path packages: one resolution turns them into the registry
    # releases of the same versions and keeps every other pin; then the install runs --locked on that lock.
    subprocess.run(["cargo", "metadata", "--format-version", "1", "--manifest-path", str(crate / "Cargo.toml")],
                   stdout=subprocess.DEVNULL, check=True, env=env)
    subprocess.run(["nice", "-n", "19", "cargo", "install", "--locked", "--root", str(root), "--path", str(crate),
                    "--bin", "mount-s3"], check=True, env=env)
    exe = installed(root)
    if exe is None:
        raise SystemExit(f"cargo install finished but {root}/bin/mount-s3 is missing")
    return exe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, required=True, help="mountpoint-s3 checkout or git directory")
    ap.add_argument("--rev", default=DEFAULT_REV)
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    ap.add_argument("--target-dir", type=Path, default=None)
    ap.add_argument("--force", action="store_true", help="build even if ROOT/bin/mount-s3 exists")
    a = ap.parse_args()
    if not a.force and installed(a.root):
        print(installed(a.root))
        return 0
    with tempfile.TemporaryDirectory(prefix="mount-s3-src-") as tmp:
        print(build(a.src, a.rev, a.root, a.target_dir, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
