#!/usr/bin/python3
# A slow disk for tests (docs/testing.md#a-slow-disk-and-a-busy-machine): a FUSE file system that
# passes every call through to a backing folder and sleeps DELAY seconds in each fsync (of a file
# or a folder), as a throttled or failing device makes a writer wait for its data to reach it. The writer waits in
# the kernel for the answer, as it would for a real device. It prints "ready" once mounted;
# whoever mounted it unmounts it (fusermount3 -u -z), which ends it. Not a general-purpose
# loopback: enough calls for a checkpoint's temporary file, fsync, rename and folder fsync.
#
#   slow_fs.py BACKING MOUNTPOINT DELAY
import errno
import os
import sys
import threading
import time

from fusepy import FUSE, FuseOSError, Operations


class Slow(Operations):
    def __init__(self, root, delay):
        self.root = root
        self.delay = delay

    def _path(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def access(self, path, mode):
        if not os.access(self._path(path), mode):
            raise FuseOSError(errno.EACCES)

    def getattr(self, path, fh=None):
        try:
            st = os.lstat(self._path(path))
        except OSError as e:
            raise FuseOSError(e.errno)
        keys = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size",
                "st_uid")
        return {k: getattr(st, k) for k in keys}

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._path(path))

    def mkdir(self, path, mode):
        return os.mkdir(self._path(path), mode)

    def rmdir(self, path):
        return os.rmdir(self._path(path))

    def unlink(self, path):
        return os.unlink(self._path(path))

    def rename(self, old, new):
        return os.rename(self._path(old), self._path(new))

    def chmod(self, path, mode):
        return os.chmod(self._path(path), mode)

    def chown(self, path, uid, gid):
        return os.chown(self._path(path), uid, gid)

    def utimens(self, path, times=None):
        return os.utime(self._path(path), times)

    def truncate(self, path, length, fh=None):
        with open(self._path(path), "r+") as f:
            f.truncate(length)

    def statfs(self, path):
        st = os.statvfs(self._path(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files",
                "f_flag", "f_frsize", "f_namemax")
        return {k: getattr(st, k) for k in keys}

    def open(self, path, flags):
        return os.open(self._path(path), flags)

    def create(self, path, mode, fi=None):
        return os.open(self._path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path, length, offset, fh):
        os.lseek(fh, offset, os.SEEK_SET)
        return os.read(fh, length)

    def write(self, path, data, offset, fh):
        os.lseek(fh, offset, os.SEEK_SET)
        return os.write(fh, data)

    def flush(self, path, fh):
        return 0

    def fsync(self, path, datasync, fh):
        time.sleep(self.delay)
        os.fsync(fh)
        return 0

    def fsyncdir(self, path, datasync, fh):
        time.sleep(self.delay)
        return 0

    def release(self, path, fh):
        return os.close(fh)


def main():
    backing, mountpoint, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
    # Ready once the mount shows: FUSE() blocks until it is unmounted.
    def announce():
        for _ in range(1000):
            if os.path.ismount(mountpoint):
                print("ready", flush=True)
                return
            time.sleep(0.01)
    threading.Thread(target=announce, daemon=True).start()
    FUSE(Slow(backing, delay), mountpoint, foreground=True, nothreads=False)


if __name__ == "__main__":
    main()
