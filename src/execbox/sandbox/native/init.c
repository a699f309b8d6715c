/* execbox-init: pid 1 of a run's pid namespace.

   The supervisor spawns it (vfork and exec: no copy of the supervisor's memory) as the first
   process of a fresh pid namespace, inside the slot's mount, network, uts and ipc namespaces.
   It joins the run's cgroup, takes a cgroup namespace of its own, mounts the run's /proc,
   drops every privilege, enters seccomp's strict mode (read, write, exit, sigreturn) and says
   "ready" on its report descriptor; then it only exists until the supervisor kills it. Its
   death ends every process of the namespace. Orphans are reaped by the kernel (SIGCHLD
   ignored). Any failure is written to the report descriptor as "init: <step>: <error>".

   Descriptors: 3 is the report pipe, 4 .. 4+N-1 are the run cgroup's cgroup.procs files (one
   per controller hierarchy); every other descriptor, stdio included, is closed.
   Usage: execbox-init UID N

   Built by `execbox image build` into the runtime image's libexec/ (static, so it runs in the
   jail's read-only root with no loader), with no C library where nolibc.h knows the system
   calls: a C library's start-up would cost more than everything init does. */

#ifdef EXECBOX_NOLIBC
#include "nolibc.h"
#endif
#include "privileges.h"

#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/mount.h>

#define REPORT_FD 3
#define FIRST_CGROUP_FD 4
#define MAX_CGROUP_FDS 8

static char *append(char *at, const char *end, const char *text) {
    while (*text && at < end)
        *at++ = *text++;
    return at;
}

static void fail(const char *step) {
    const char *why = strerror(errno);
    char msg[256];
    char *end = append(msg, msg + sizeof msg, "init: ");
    end = append(end, msg + sizeof msg, step);
    end = append(end, msg + sizeof msg, ": ");
    end = append(end, msg + sizeof msg, why);
    (void)!write(REPORT_FD, msg, (size_t)(end - msg));
    _exit(1);
}

/* A decimal number in [lo, hi], digits only. */
static long parse(const char *text, long lo, long hi, const char *what) {
    long value = 0;
    const char *p = text;
    for (; *p >= '0' && *p <= '9' && value <= (hi - (*p - '0')) / 10; p++)
        value = value * 10 + (*p - '0');
    if (*p || p == text || value < lo || value > hi) {
        errno = EINVAL;
        fail(what);
    }
    return value;
}

/* Whether init runs in a user namespace of its own (rootless mode): the initial one maps
   every uid, "0 0 4294967295". */
static int in_user_namespace(void) {
    static int known = -1;
    if (known < 0) {
        char map[64] = {0};
        int fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/uid_map", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            fail("open /proc/self/uid_map");
        ssize_t got = read(fd, map, sizeof map - 1);
        (void)!syscall(SYS_close, fd);
        if (got <= 0)
            fail("read /proc/self/uid_map");
        known = 1;
        for (ssize_t i = 0; i + 10 <= got; i++) {
            const char *all = "4294967295";
            int same = 1;
            for (int j = 0; j < 10; j++)
                same &= map[i + j] == all[j];
            if (same)
                known = 0;
        }
    }
    return known;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        errno = EINVAL;
        fail("usage: execbox-init UID N");
    }
    uid_t uid = (uid_t)parse(argv[1], 1, 0x7fffffff, "the uid argument");
    int cgroups = (int)parse(argv[2], 0, MAX_CGROUP_FDS, "the cgroup count argument");

    /* The supervisor spawns us with every signal blocked (see stage.c): none stays so. */
    static const sigset_t none;
    if (sigprocmask(SIG_SETMASK, &none, NULL))
        fail("unblock signals");
    /* A killed supervisor takes init, and so the whole namespace, along. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0))
        fail("arm the parent-death signal");
    for (int i = 0; i < cgroups; i++) {
        if (write(FIRST_CGROUP_FD + i, "0", 1) != 1)
            fail("join cgroup");
    }
    if (syscall(SYS_close_range, 0, 2, 0) || syscall(SYS_close_range, FIRST_CGROUP_FD, ~0U, 0))
        fail("close inherited descriptors");
    if (unshare(CLONE_NEWCGROUP))
        fail("unshare cgroup namespace");
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
        fail("mount /proc");
    /* /proc/keys lists every key the run's host uid may view: in rootless mode that uid is
       the caller's, whose keys' names a run must not learn. Root mode's run uid owns none. */
    static const char *const masked[] = {"/proc/keys", "/proc/key-users"};
    for (size_t i = 0; in_user_namespace() && i < sizeof masked / sizeof masked[0]; i++) {
        if (mount("/dev/null", masked[i], NULL, MS_BIND, NULL)) {
            if (errno == ENOENT) /* a kernel without keys */
                continue;
            fail("mask /proc/keys");
        }
        unsigned long ro = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC; /* a device */
        if (mount(NULL, masked[i], NULL, ro, NULL))
            fail("make the /proc/keys mask read-only");
    }
    struct sigaction ignore;
    memset(&ignore, 0, sizeof ignore);
    ignore.sa_handler = SIG_IGN;
    /* SIGCHLD ignored: the kernel reaps orphans; SIGPIPE ignored: a write to a closed pipe
       fails with EPIPE instead. */
    if (sigaction(SIGCHLD, &ignore, NULL) || sigaction(SIGPIPE, &ignore, NULL))
        fail("ignore SIGCHLD and SIGPIPE");
    const char *step;
    if (execbox_drop_privileges(uid, &step))
        fail(step);
    /* Changing credentials cleared the parent-death signal: arm it again. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0))
        fail("arm the parent-death signal");
    /* Not dumpable whatever fs.suid_dumpable says: /proc/1 stays closed to the program. */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0))
        fail("make init undumpable");
    int hold[2]; /* init reads its own pipe forever: the write end stays open here */
    if (pipe(hold))
        fail("make the idle pipe");
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT, 0, 0, 0))
        fail("enter seccomp strict mode");
    /* From here on only read, write and exit. A supervisor that died before the signal was
       armed closed the report pipe: the write fails and init ends (strict mode kills the
       process on the C library's exit_group: the same end). */
    if (write(REPORT_FD, "ready", 5) != 5)
        _exit(1);
    char byte;
    for (;;)
        (void)!read(hold[0], &byte, 1);
}
