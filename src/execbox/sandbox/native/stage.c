/* A supervisor's staging of one run, in C: system calls only (see `supervisor`).

   Staging is what a run needs that does not depend on its request, done after the last run
   and before the next request: about sixty system calls, which as one Python step each cost
   the supervisor more CPU than the calls themselves. The supervisor calls this through ctypes.

   execbox_stage_run(args, out, error, error_len)
     In order:
       0. fresh network state: unless this is the slot's first run (whose namespace the
          supervisor has just made), the network namespace's state (`NET_FILES`, read through
          args->net_dir, the supervisor's /proc/<pid>/net, which follows its namespace) is
          compared with what it was when the namespace was new (the files stay open for the
          namespace's life and are read again from their start); if anything differs (a run
          used a socket: connections left TIME_WAIT entries, counters moved, a flow label or
          unix socket lingers), the supervisor moves to a new network namespace with
          loopback up, the old one going with the last run's processes. A new namespace costs
          ~0.4-0.7 ms of CPU, the comparison ~0.1 ms, and most runs never touch the network;
       1. fresh scratch tmpfs: each of args->n_scratch mount points is unmounted (detached; not
          on a slot's first run) and mounted anew with its options;
       2. new pid and ipc namespaces: the supervisor's children go back to its own pid
          namespace (setns on args->own_pid_ns), then to a new one, with a new ipc namespace;
       3. init (args->init, `init.c`), spawned with vfork and exec as pid 1 of the new pid
          namespace: descriptor 3 its report pipe, 4.. the cgroup.procs files of the slot's
          cgroup (args->cgroup_procs: the supervisor's, open for the slot's life; one per
          controller hierarchy), an empty environment. Its report is read whole:
          anything but "ready" is init's error, returned as it is;
       4. pipes for the program's stdin, stdout, stderr, structured error, set-up error, exit
          report, code, and for its zygote's report of its end (the supervisor's ends of the
          error, set-up, exit-report and end pipes non-blocking);
       5. the spawn request to the program zygote (args->spawn, SOCK_SEQPACKET): "1 <cgroups>
          <warm> <uid>" (args->uid, the slot's own) with the descriptors `program`'s docstring lists, init's namespaces as one
          pidfd of init (`pidfd_open`: the program joins them all in one setns, where six
          opens of /proc/1/ns/ and five joins cost ~40 us a run more).
     Every descriptor the program's side takes is closed here once sent. Returns 0 with `out`
     filled (see `struct stage_out`); or -1 with "<step>: <error>" in `error` (init's own
     report, "init: ...", when init failed), everything opened here closed and `out->init_pid`
     set when init was started (the caller kills and reaps it). */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_SCRATCH 4
#define MAX_CGROUPS 8
#define INIT_FIRST_FD 3 /* the report pipe, then the cgroup.procs files */

struct stage_args {
    int first;                     /* the slot's first run: no scratch mounts to replace */
    int n_scratch;
    const char *const *scratch;    /* mount points */
    const char *const *options;    /* their tmpfs options ("size=...,mode=...") */
    const unsigned long *flags;    /* their extra mount flags */
    int own_pid_ns;
    int n_cgroups;
    const int *cgroup_procs;       /* open for writing, kept by the caller */
    const char *init;
    const char *init_uid;          /* init's argv[1] */
    int spawn;
    int warm;                      /* 0: the base pages, 1: all, 2: none */
    unsigned uid;                  /* the program's, the slot's own */
    int net_dir;                   /* the supervisor's /proc/<pid>/net, O_PATH */
};

struct stage_out {
    int init_pid;
    int stdin_w, stdout_r, stderr_r;                 /* the host's ends */
    int err_r, setup_r, status_r, go_w, done_r;      /* the supervisor's ends */
    int fresh_net;                                   /* a new network namespace was made */
};

/* What a run can learn of its network namespace's past, per namespace: interface counters,
   the IP, ICMP, TCP and UDP counters of both families (every packet and every refused send
   moves one: TIME_WAIT entries and tcp_metrics only come with packets), IPv6 flow labels and
   unix sockets (which a socket passed to itself keeps past its processes). Files that mix
   in counters of the whole machine (sockstat's memory) would differ every time: not here. */
static const char *const NET_FILES[] = {"dev", "snmp", "snmp6", "ip6_flowlabel", "unix"};
#define N_NET_FILES (sizeof NET_FILES / sizeof NET_FILES[0])
#define NET_STATE_MAX 32768
static char net_new[NET_STATE_MAX], net_now[NET_STATE_MAX]; /* one slot per process */
static size_t net_new_len;
/* NET_FILES, open on the current namespace (each open file keeps the namespace it was opened
   in): opened at the first read, closed when the namespace is replaced. Reading them again from
   offset 0 formats them anew, and saves an open and a close of each file a run. NET_ABSENT:
   a file the kernel did not have at the first read (snmp6 and ip6_flowlabel when booted with
   ipv6.disable=1) holds no state a run could leave; it is not looked for again. */
#define NET_ABSENT (-2)
static int net_fds[N_NET_FILES] = {-1, -1, -1, -1, -1};
static int net_read_once;

static void close_net_files(void) {
    for (size_t i = 0; i < N_NET_FILES; i++)
        if (net_fds[i] >= 0) {
            close(net_fds[i]);
            net_fds[i] = -1;
        }
}

/* Read NET_FILES into `buf`, one after the other, each from its start. Returns the length, or
   -1 with errno set (E2BIG when they do not fit: a namespace that full is not a new one). */
static ssize_t read_net_state(int dir, char *buf) {
    size_t len = 0;
    for (size_t i = 0; i < N_NET_FILES; i++) {
        if (net_fds[i] == NET_ABSENT)
            continue;
        if (net_fds[i] < 0) {
            net_fds[i] = openat(dir, NET_FILES[i], O_RDONLY | O_CLOEXEC);
            if (net_fds[i] < 0 && errno == ENOENT && !net_read_once) {
                net_fds[i] = NET_ABSENT;
                continue;
            }
            if (net_fds[i] < 0)
                return -1;
        }
        ssize_t n;
        off_t at = 0;
        while ((n = pread(net_fds[i], buf + len, NET_STATE_MAX - len, at)) > 0) {
            len += (size_t)n;
            at += n;
        }
        if (n < 0)
            return -1;
        if (len == NET_STATE_MAX) {
            errno = E2BIG;
            return -1;
        }
    }
    net_read_once = 1;
    return (ssize_t)len;
}

/* Bring `lo` up in the current network namespace. */
static int loopback_up(void) {
    int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return -1;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    int rc = ioctl(sock, SIOCGIFFLAGS, &ifr);
    if (rc == 0) {
        ifr.ifr_flags |= IFF_UP;
        rc = ioctl(sock, SIOCSIFFLAGS, &ifr);
    }
    int saved = errno;
    close(sock);
    errno = saved;
    return rc;
}

/* Step 0: 1 when a new namespace was made, 0 when the one we have is as new, -1 on error. */
static int fresh_network(const struct stage_args *a) {
    ssize_t len;
    if (!a->first) {
        len = read_net_state(a->net_dir, net_now);
        if (len >= 0 && (size_t)len == net_new_len && memcmp(net_now, net_new, net_new_len) == 0)
            return 0;
        if (len < 0 && errno != E2BIG)
            return -1;
        if (unshare(CLONE_NEWNET))
            return -1;
        close_net_files(); /* the old namespace's: it goes with them */
        if (loopback_up())
            return -1;
    }
    len = read_net_state(a->net_dir, net_new);
    if (len < 0)
        return -1;
    net_new_len = (size_t)len;
    return !a->first;
}

static int stage_failed(const char *step, char *error, size_t error_len) {
    snprintf(error, error_len, "%s: %s", step, strerror(errno));
    return -1;
}

static void close_fds(int *fds, int n) {
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) {
            close(fds[i]);
            fds[i] = -1;
        }
}

/* vfork and exec `path` with `fds` (n of them, none below 3 + n) at 3, 4, ..., and an empty
   environment. Returns its pid, or -1 with errno set (an exec that failed is reaped here).

   The child borrows our memory and stack until its exec, so it makes system calls only, with
   every signal blocked: no handler of ours (the supervisor's Python has some) can run in it.
   Init starts with them blocked and unblocks them itself. posix_spawn did the same with ~130
   more system calls a run (a query and a reset of each of the 64 signal handlers, a stack
   mapped and unmapped, a getrlimit for each descriptor it checks): 114-118 against 84-89 us
   of CPU a spawn, measured alone. */
static pid_t __attribute__((noinline)) vfork_exec(const char *path, char *const argv[],
                                                  const int *fds, int n) {
    char *envp[] = {NULL};
    sigset_t all, old;
    sigfillset(&all);
    int err = pthread_sigmask(SIG_BLOCK, &all, &old);
    if (err) {
        errno = err;
        return -1;
    }
    volatile int child_errno = 0; /* written by the child, in our memory, when it fails */
    pid_t pid = vfork();
    if (pid == 0) {
        for (int i = 0; i < n; i++)
            if (dup2(fds[i], INIT_FIRST_FD + i) < 0) {
                child_errno = errno;
                _exit(127);
            }
        execve(path, argv, envp);
        child_errno = errno;
        _exit(127);
    }
    int vfork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        errno = vfork_errno;
    } else if (child_errno) { /* it never became init: reap it, report why */
        int why = child_errno;
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        errno = why;
        pid = -1;
    }
    return pid;
}

/* Spawn init with `fds` at 3, 4, ...: moved out of the way first (to 64 and up), so that no
   dup2 onto a target number overwrites a later source. Returns its pid or -1. */
static pid_t spawn_init(const struct stage_args *a, const int *fds, int n) {
    int high[1 + MAX_CGROUPS];
    int made = 0;
    pid_t pid = -1;
    for (; made < n; made++) {
        high[made] = fcntl(fds[made], F_DUPFD_CLOEXEC, 64);
        if (high[made] < 0)
            goto out;
    }
    char count[16];
    snprintf(count, sizeof count, "%d", a->n_cgroups);
    char *argv[] = {"execbox-init", (char *)a->init_uid, count, NULL};
    pid = vfork_exec(a->init, argv, high, n);
out:;
    int saved = errno;
    close_fds(high, made);
    errno = saved;
    return pid;
}

/* Read init's report: "ready", or its error, written whole before it exits. Returns 0, or -1
   when the pipe could not be read. */
static int read_report(int fd, char *report, size_t size) {
    size_t got = 0;
    int result = 0;
    while (got < size - 1) {
        ssize_t n = read(fd, report + got, size - 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            result = -1;
        if (n <= 0)
            break;
        got += (size_t)n;
        if (got == 5 && memcmp(report, "ready", 5) == 0)
            break;
    }
    report[got] = 0;
    return result;
}

int execbox_stage_run(const struct stage_args *a, struct stage_out *out, char *error,
                      size_t error_len) {
    /* Everything opened here, so that one place closes it on failure. */
    enum { REPORT_R, REPORT_W, STDIN_R, STDIN_W, STDOUT_R, STDOUT_W, STDERR_R, STDERR_W,
           ERR_R, ERR_W, SETUP_R, SETUP_W, STATUS_R, STATUS_W, GO_R, GO_W, DONE_R, DONE_W,
           N_PIPE_FDS };
    int p[N_PIPE_FDS], init_pidfd = -1;
    const int *procs = a->cgroup_procs, n_procs = a->n_cgroups;
    for (int i = 0; i < N_PIPE_FDS; i++)
        p[i] = -1;
    out->init_pid = 0;
    out->fresh_net = 0;
    if (a->n_scratch < 0 || a->n_scratch > MAX_SCRATCH || a->n_cgroups < 0 ||
        a->n_cgroups > MAX_CGROUPS) {
        errno = EINVAL;
        return stage_failed("stage a run: malformed arguments", error, error_len);
    }
    const char *step = "fresh network state";
    int fresh = fresh_network(a);
    if (fresh < 0)
        goto failed;
    out->fresh_net = fresh;
    step = "mount fresh /workspace, /tmp and /dev/shm";
    for (int i = 0; i < a->n_scratch; i++) {
        if (!a->first && umount2(a->scratch[i], MNT_DETACH))
            goto failed;
        if (mount("tmpfs", a->scratch[i], "tmpfs", MS_NOSUID | MS_NODEV | a->flags[i],
                  a->options[i]))
            goto failed;
    }
    step = "new pid and ipc namespaces";
    if (setns(a->own_pid_ns, CLONE_NEWPID) || unshare(CLONE_NEWPID | CLONE_NEWIPC))
        goto failed;
    step = "spawn init";
    if (pipe2(&p[REPORT_R], O_CLOEXEC))
        goto failed;
    int init_fds[1 + MAX_CGROUPS];
    init_fds[0] = p[REPORT_W];
    memcpy(init_fds + 1, procs, sizeof(int) * (size_t)n_procs);
    pid_t pid = spawn_init(a, init_fds, 1 + n_procs);
    if (pid < 0)
        goto failed;
    out->init_pid = pid;
    close_fds(&p[REPORT_W], 1);
    char report[512];
    step = "read init's report";
    if (read_report(p[REPORT_R], report, sizeof report))
        goto failed;
    if (strcmp(report, "ready") != 0) {
        snprintf(error, error_len, "%s", report[0] ? report : "init: exited during set-up");
        goto cleanup;
    }
    close_fds(&p[REPORT_R], 1);
    /* Init's namespaces are the ones the program joins: its zygote and the program join them
       through this (init is ours, unreaped: the pid names it). */
    step = "open a pidfd of init";
    init_pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (init_pidfd < 0)
        goto failed;
    step = "make the run's pipes";
    for (int i = STDIN_R; i < N_PIPE_FDS; i += 2)
        if (pipe2(&p[i], O_CLOEXEC))
            goto failed;
    /* The supervisor's read ends never block: it waits in poll only, and reads what is there
       (a read that waited for every writer to close would wait for the run's teardown). */
    int nonblocking[] = {ERR_R, SETUP_R, STATUS_R, DONE_R};
    for (size_t i = 0; i < sizeof nonblocking / sizeof nonblocking[0]; i++)
        if (fcntl(p[nonblocking[i]], F_SETFL, O_NONBLOCK))
            goto failed;
    step = "ask the zygote for the program";
    {
        int fds[2 + MAX_CGROUPS + 7], n = 0;
        fds[n++] = p[STATUS_W];
        fds[n++] = init_pidfd;
        for (int i = 0; i < n_procs; i++)
            fds[n++] = procs[i];
        int rest[] = {p[STDIN_R], p[STDOUT_W], p[STDERR_W], p[GO_R], p[ERR_W], p[SETUP_W],
                      p[DONE_W]};
        for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
            fds[n++] = rest[i];
        char layout[48];
        int len = snprintf(layout, sizeof layout, "1 %d %d %u", n_procs, a->warm, a->uid);
        union {
            struct cmsghdr header;
            char space[CMSG_SPACE(sizeof fds)];
        } control;
        memset(&control, 0, sizeof control);
        struct iovec iov = {.iov_base = layout, .iov_len = (size_t)len};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.space,
                            .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n)};
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n);
        ssize_t sent;
        while ((sent = sendmsg(a->spawn, &mh, MSG_NOSIGNAL)) < 0 && errno == EINTR)
            ;
        if (sent != len) {
            if (sent >= 0)
                errno = EMSGSIZE; /* cut short: no error of its own to report */
            goto failed;
        }
    }
    /* Sent: the zygote holds its own copies of the program's side. */
    close_fds(&init_pidfd, 1);
    int theirs[] = {STATUS_W, STDIN_R, STDOUT_W, STDERR_W, GO_R, ERR_W, SETUP_W, DONE_W};
    for (size_t i = 0; i < sizeof theirs / sizeof theirs[0]; i++)
        close_fds(&p[theirs[i]], 1);
    *out = (struct stage_out){pid, p[STDIN_W], p[STDOUT_R], p[STDERR_R], p[ERR_R], p[SETUP_R],
                              p[STATUS_R], p[GO_W], p[DONE_R], fresh};
    return 0;
failed:
    stage_failed(step, error, error_len);
cleanup:
    close_fds(p, N_PIPE_FDS);
    close_fds(&init_pidfd, 1);
    return -1;
}
