"""What the filesystem under the board can do: its type (a network filesystem gives no inotify
events and no flock mutual exclusion across clients) and the inotify limits, for `doctor`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

NETWORK_FS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "afs", "9p", "fuse.sshfs", "sshfs", "ceph",
    "glusterfs", "fuse.glusterfs", "lustre", "gpfs", "beegfs", "fuse.s3fs", "fuse.rclone", "davfs",
    "fuse.davfs2", "virtiofs",
})


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    source: str


def _unescape(field: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as octal.
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def parse_mounts(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            mounts.append(Mount(point=_unescape(parts[1]), fstype=parts[2], source=_unescape(parts[0])))
    return mounts


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding `path` (an absolute, resolved path): the longest matching mount point."""
    best: Mount | None = None
    for mount in mounts:
        point = mount.point.rstrip("/") or "/"
        inside = path == point or path.startswith(point + "/") or point == "/"
        if inside and (best is None or len(point) >= len(best.point.rstrip("/") or "/")):
            best = mount
    return best


def is_network(fstype: str) -> bool:
    return fstype in NETWORK_FS or fstype.startswith(("nfs", "cifs", "smb"))


def filesystem_of(path: Path) -> Mount | None:
    try:
        text = Path("/proc/self/mounts").read_text()
    except OSError:
        return None
    return mount_of(str(path.resolve()), parse_mounts(text))


def inotify_limits() -> dict[str, int | None]:
    limits: dict[str, int | None] = {}
    for name in ("max_user_watches", "max_user_instances", "max_queued_events"):
        try:
            limits[name] = int(Path(f"/proc/sys/fs/inotify/{name}").read_text().strip())
        except (OSError, ValueError):
            limits[name] = None
    return limits


def disk_free(path: Path) -> tuple[int, int]:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize
