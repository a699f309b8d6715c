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
   Failures are written to stderr as "execbox-enter: <step> <path>: <error>" (exit 127).

   Rootless mode (an ordinary user: no loop device, no write access to /run):
   execbox-enter --hold-userns UID GID
     makes a user namespace in which UID and GID alone are mapped, to the caller's own ids,
     and in it a pid namespace whose pid 1 lives until stdin closes; says "ready PID" (that
     pid 1's, in the caller's pid namespace). Every zygote of the host joins both: a process
     can only setns into a pid namespace owned by a user namespace it has capabilities in,
     and the supervisor and the program zygotes go back to their own after each run's.
   execbox-enter --hold-userns-mapped
     the same, but its ids are mapped from outside: it says "map PID" once the user namespace
     exists, and goes on when a line arrives on stdin (after newuidmap and newgidmap ran).
   execbox-enter --userns USER_FD PID_FD DIRECTORY bind ENV_DIR PACKAGE_SOURCE PACKAGE_DIR
                 PROGRAM...
     joins them, keeps its capabilities there across the exec as ambient ones (its uid is
     not 0 there), mounts a tmpfs of its own on /run and binds DIRECTORY (the image's tree)
     at ENV_DIR instead of mounting a device. */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <signal.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

__attribute__((noreturn)) static void fail(const char *step, const char *what) {
    fprintf(stderr, "execbox-enter: %s %s: %s\n", step, what, strerror(errno));
    _exit(127);
}

static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
        fail("write", path);
    close(fd);
}

static void mkdir_p(const char *path) {
    char buf[256];
    if (strlen(path) >= sizeof buf) {
        errno = ENAMETOOLONG;
        fail("mkdir", path);
    }
    strcpy(buf, path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char end = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                fail("mkdir", buf);
            if (end == '\0')
                return;
            *p = end;
        }
    }
}

/* A user namespace where the ids given alone are mapped, to ours, and in it a pid namespace
   whose pid 1 is our child: it lives until stdin closes, and every process of the namespace
   dies with it. Says "ready <child's pid>" once both can be opened through /proc. */
__attribute__((noreturn)) static void hold_userns(const char *uid, const char *gid) {
    char map[64];
    unsigned outside_uid = (unsigned)geteuid(), outside_gid = (unsigned)getegid();
    if (unshare(CLONE_NEWUSER) != 0)
        fail("unshare", "a user namespace");
    if (uid == NULL) {
        /* Mapped from outside (newuidmap and newgidmap, setuid root there: only they may map
           subordinate ids): say our pid, wait for the line that says it is done. */
        printf("map %d\n", (int)getpid());
        fflush(stdout);
        char byte = 0;
        while (byte != '\n') {
            if (read(0, &byte, 1) != 1)
                fail("read", "the word that the ids are mapped");
        }
    } else {
        write_file("/proc/self/setgroups", "deny");
        snprintf(map, sizeof map, "%s %u 1", uid, outside_uid);
        write_file("/proc/self/uid_map", map);
        snprintf(map, sizeof map, "%s %u 1", gid, outside_gid);
        write_file("/proc/self/gid_map", map);
    }
    if (unshare(CLONE_NEWPID) != 0)
        fail("unshare", "a pid namespace");
    pid_t child = fork();
    if (child < 0)
        fail("fork", "the pid namespace's init");
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        char byte;
        while (read(0, &byte, 1) > 0)
            ;
        _exit(0);
    }
    close(0);
    printf("ready %d\n", (int)child);
    fflush(stdout);
    int status;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    _exit(0);
}

/* Join the user and pid namespaces `user_fd` and `pid_fd` (see `hold_userns`) and keep
   every capability there across the exec to come; the caller goes on in a child, in the pid
   namespace, while this process waits for it and exits as it did. */
static void join_namespaces(const char *user_fd, const char *pid_fd) {
    int user = atoi(user_fd), pid = atoi(pid_fd);
    if (setns(user, CLONE_NEWUSER) != 0)
        fail("join", "the user namespace");
    if (setns(pid, CLONE_NEWPID) != 0)
        fail("join", "the pid namespace");
    close(user);
    close(pid);
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &header, data))
        fail("read", "capabilities");
    data[0].inheritable = data[0].permitted;
    data[1].inheritable = data[1].permitted;
    if (syscall(SYS_capset, &header, data))
        fail("set", "inheritable capabilities");
    for (int cap = 0; prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0; cap++)
        if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0))
            fail("raise", "ambient capabilities");
    pid_t child = fork();
    if (child < 0)
        fail("fork", "into the pid namespace");
    if (child == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0))
            fail("arm", "the parent-death signal");
        return;
    }
    int status;
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR)
            fail("wait", "for the zygote");
    }
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--hold-userns") == 0)
        hold_userns(argv[2], argv[3]);
    if (argc == 2 && strcmp(argv[1], "--hold-userns-mapped") == 0)
        hold_userns(NULL, NULL);
    int rootless = argc > 4 && strcmp(argv[1], "--userns") == 0;
    if (rootless) {
        join_namespaces(argv[2], argv[3]);
        argv += 3;
        argc -= 3;
    }
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
    char package_path[64], device_path[64];
    if (rootless) {
        /* Opened before the tmpfs may hide them (a source under /run). */
        int package_fd = open(package_source, O_PATH | O_DIRECTORY | O_CLOEXEC);
        int tree_fd = open(device, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (package_fd < 0 || tree_fd < 0)
            fail("open", package_fd < 0 ? package_source : device);
        snprintf(package_path, sizeof package_path, "/proc/self/fd/%d", package_fd);
        snprintf(device_path, sizeof device_path, "/proc/self/fd/%d", tree_fd);
        package_source = package_path;
        device = device_path;
        /* Our own /run: the host's is not ours to write, and holds nothing a zygote needs. */
        if (mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m") != 0)
            fail("mount", "/run");
        mkdir_p(env_dir);
        mkdir_p(package_dir);
    }
    if (strcmp(fstype, "bind") == 0) {
        if (mount(device, env_dir, NULL, MS_BIND | MS_REC, NULL) != 0)
            fail("bind", env_dir);
        if (mount(NULL, env_dir, NULL, MS_REMOUNT | MS_BIND | ro, NULL) != 0)
            fail("remount read-only", env_dir);
    } else if (mount(device, env_dir, fstype, ro, NULL) != 0)
        fail("mount", env_dir);
    if (mount(package_source, package_dir, NULL, MS_BIND, NULL) != 0)
        fail("bind", package_dir);
    if (mount(NULL, package_dir, NULL, MS_REMOUNT | MS_BIND | ro, NULL) != 0)
        fail("remount read-only", package_dir);
    execv(argv[6], argv + 6);
    fail("exec", argv[6]);
}
