#!/usr/bin/env python3
"""A disk that fails on demand, for the host rig (scripts/hosts.sh): a FUSE file system that
passes every operation through to BACKING, unless the file SWITCH exists. Then, by what SWITCH
holds:

  write   every write, sync, create, rename, removal, truncation and attribute change fails
          with EIO (a disk that went bad for writes; reads still work);
  all     every operation but the mount's own root lookup fails with EIO.

  rig-faultfs.py BACKING MOUNTPOINT SWITCH

Runs in the foreground until the file system is unmounted. Needs fusepy and libfuse2
(`scripts/hosts.sh setup` installs both).
"""

import errno
import os
import sys

from fuse import FUSE, FuseOSError, Operations


class FaultFs(Operations):
    def __init__(self, backing, switch):
        self.backing = os.path.realpath(backing)
        self.switch = switch

    def _path(self, path):
        return os.path.join(self.backing, path.lstrip("/"))

    def _mode(self):
        try:
            with open(self.switch) as f:
                return f.read().strip() or "write"
        except FileNotFoundError:
            return None

    def _check(self, writing):
        mode = self._mode()
        if mode == "all" or (mode is not None and writing):
            raise FuseOSError(errno.EIO)

    # Reads.
    def getattr(self, path, fh=None):
        if path != "/":
            self._check(False)
        st = os.lstat(self._path(path)) if fh is None else os.fstat(fh)
        keys = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid", "st_blocks", "st_ino")
        return {k: getattr(st, k) for k in keys}

    def access(self, path, amode):
        self._check(False)
        if not os.access(self._path(path), amode):
            raise FuseOSError(errno.EACCES)

    def readdir(self, path, fh):
        self._check(False)
        return [".", ".."] + os.listdir(self._path(path))

    def readlink(self, path):
        self._check(False)
        return os.readlink(self._path(path))

    def statfs(self, path):
        st = os.statvfs(self._path(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")
        return {k: getattr(st, k) for k in keys}

    def open(self, path, flags):
        self._check(bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC)))
        return os.open(self._path(path), flags)

    def read(self, path, size, offset, fh):
        self._check(False)
        return os.pread(fh, size, offset)

    def release(self, path, fh):
        os.close(fh)

    def flush(self, path, fh):
        # Writes went to the backing file already (pwrite); close(2) has nothing to push.
        return 0

    # Writes.
    def create(self, path, mode, fi=None):
        self._check(True)
        return os.open(self._path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def write(self, path, data, offset, fh):
        self._check(True)
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        self._check(True)
        if fh is None:
            os.truncate(self._path(path), length)
        else:
            os.ftruncate(fh, length)

    def fsync(self, path, datasync, fh):
        self._check(True)
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)

    def fsyncdir(self, path, datasync, fh):
        self._check(True)
        fd = os.open(self._path(path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def mkdir(self, path, mode):
        self._check(True)
        os.mkdir(self._path(path), mode)

    def rmdir(self, path):
        self._check(True)
        os.rmdir(self._path(path))

    def unlink(self, path):
        self._check(True)
        os.unlink(self._path(path))

    def rename(self, old, new):
        self._check(True)
        os.rename(self._path(old), self._path(new))

    def link(self, target, name):
        self._check(True)
        os.link(self._path(name), self._path(target))

    def symlink(self, name, target):
        self._check(True)
        os.symlink(target, self._path(name))

    def chmod(self, path, mode):
        self._check(True)
        os.chmod(self._path(path), mode)

    def chown(self, path, uid, gid):
        self._check(True)
        os.chown(self._path(path), uid, gid)

    def utimens(self, path, times=None):
        self._check(True)
        os.utime(self._path(path), times)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    backing, mountpoint, switch = sys.argv[1:]
    FUSE(FaultFs(backing, switch), mountpoint, foreground=True, nothreads=False, allow_other=True, default_permissions=True)


if __name__ == "__main__":
    main()
