/* execbox-enter: start a zygote in a mount namespace of its own, where the runtime image and
   execbox's in-image package are at fixed paths.

   An interpreter computes sys.prefix, sys.path and every module's and code object's file name
   from where it was started, and a forked program inherits them all: a zygote started from
   the image's directory under the user's data directory would show that path to the code it
   forks. Started here, everything it learns about where it lives is ENV_DIR and PACKAGE_DIR,
   the same paths the jail mounts them at. The image is a filesystem of its own on a loop
   device (see `sandbox/host/loop.py`), so even the jail's /proc/self/mountinfo shows "/" as
   the mount's root within its filesystem, not the directory it came from.

   Usage: execbox-enter DEVICE FSTYPE ENV_DIR PACKAGE_SOURCE PACKAGE_DIR PROGRAM [ARG...]
   mounts DEVICE (a filesystem of type FSTYPE) at ENV_DIR and binds PACKAGE_SOURCE at
   PACKAGE_DIR, both read-only, then executes PROGRAM with the environment it was given.
   Failures are written to stderr as "execbox-enter: <step> <path>: <error>" (exit 127). */

#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

__attribute__((noreturn)) static void fail(const char *step, const char *what) {
    fprintf(stderr, "execbox-enter: %s %s: %s\n", step, what, strerror(errno));
    _exit(127);
}

int main(int argc, char **argv) {
    if (argc < 7) {
        errno = EINVAL;
        fail("usage:", "DEVICE FSTYPE ENV_DIR PACKAGE_SOURCE PACKAGE_DIR PROGRAM [ARG...]");
    }
    const char *device = argv[1], *fstype = argv[2], *env_dir = argv[3];
    const char *package_source = argv[4], *package_dir = argv[5];
    const unsigned long ro = MS_RDONLY | MS_NOSUID | MS_NODEV;
    if (unshare(CLONE_NEWNS) != 0)
        fail("unshare", "a mount namespace");
    /* Nothing mounted here reaches the host, nor anything the host mounts later here. */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        fail("make private", "/");
    if (mount(device, env_dir, fstype, ro, NULL) != 0)
        fail("mount", env_dir);
    if (mount(package_source, package_dir, NULL, MS_BIND, NULL) != 0)
        fail("bind", package_dir);
    if (mount(NULL, package_dir, NULL, MS_REMOUNT | MS_BIND | ro, NULL) != 0)
        fail("remount read-only", package_dir);
    execv(argv[6], argv + 6);
    fail("exec", argv[6]);
}
