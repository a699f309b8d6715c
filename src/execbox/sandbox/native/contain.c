/* libexecbox-contain: a program zygote's fork server, and the steps that contain a program.

   A program is a fork of a program zygote, a big interpreter whose pages the fork shares:
   every Python step, in the child or in the zygote between forks, copies the pages of every
   object it touches, and so does CPython's own after-fork work (os.fork reinitialises the
   runtime's locks and threads and runs every module's at-fork hook: ~0.5 ms of CPU per fork).
   So the zygote's loop, the fork and the contain steps are system calls only, here, and a
   child returns to Python contained (see `program`, which calls this through ctypes with the
   GIL held: a program zygote is single-threaded, checked at its start, so nothing CPython
   reinitialises after a fork was in use).

   execbox_serve_programs(host, spawn, own_pid_ns, n_ns, ns_types, uid_first, uid_count,
                          filter, warm, n_base, n_warm, kept, error, error_len)
     Serves spawn requests from `spawn` (SOCK_SEQPACKET; see `program` for the message) until
     `host` reaches end of file: forks each program into its slot (`fork_program`) as the
     uid its request names (its slot's own), watches it through a pidfd, reaps it and writes
     its wait status to the request's status pipe as {"status": N}, or {"error": "..."} when
     it could not be forked. Malformed requests, and those naming a uid outside [uid_first,
     uid_first + uid_count), are dropped, their descriptors closed. Returns 0 at end of file, 1 in a forked child,
     contained, with the four descriptors it keeps in `kept` (close-on-exec, like every
     descriptor received here), 2 when a signal arrived (the caller lets its handler run,
     then calls again), or -1 with "<step>: <error>" in `error` when the zygote cannot go on
     (it must not fork again: it exits). Signals are blocked except while it waits in ppoll:
     one that arrives is handled by the caller before the next fork, never left pending for a
     child to inherit (CPython's own after-fork work, which clears that, does not run here);
     each child starts with the caller's signal mask.

   Each child, once contained, also copies at once the pages programs are known to write
   first (`warm`, n_warm [start, end) address pairs: see `prefault`), while it waits for its
   code, instead of one page fault at a time while it runs: the first n_base pairs, which
   every program writes, or all of them, or none, as its request asks (by its slot's kind,
   see `protocol.SLOT_KINDS`, and by how soon its slot's last request came: see
   `supervisor`).

   execbox_written_pages(ranges, n, out)
     Called by a training fork (see `prefault`) just before it exits: of the [start, end)
     address pairs in `ranges` (the zygote's private writable mappings when it forked), writes
     to `out` the pairs that this process has written (its own anonymous copies, read from
     /proc/self/pagemap), contiguous pages as one pair. Returns 0, or -1 with errno set.

   execbox_contain(fds, n_ns, ns_types, n_cgroups, uid, filter, error, error_len):
     fds       the request's descriptors: n_ns namespace descriptors or pidfds (ns_types[i]
               is the CLONE_NEW* flags joined through fds[i], in one setns for a pidfd;
               CLONE_NEWPID is skipped, the zygote forked us into it), n_cgroups cgroup.procs
               files, then stdin, stdout, stderr, then KEEP descriptors the program keeps at
               their numbers
     uid       the unprivileged uid to become
     filter    the seccomp program (struct sock_fprog), installed last
   In order: join the cgroup, join the namespaces (with the mount namespace, root and working
   directory become the jail's; an init gone by then, its slot killed, kills us too), stdio
   on 0-2, every other descriptor closed, /workspace, privileges dropped (privileges.h),
   umask 022, seccomp. Returns 0, or -1 with "<step>: <error>" in `error`.

   Built by `execbox image build` into the runtime image's libexec/. */

#include "privileges.h"

#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stdio.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define KEEP 4 /* go, error, set-up error and exit report: see program.ProgramFds */
#define KEEP_SETUP 2 /* the set-up error descriptor, among the kept ones */
#define MAX_FDS 64 /* per spawn request */
#define MAX_CGROUPS 8
#define STATUS_FDS 1 /* the status pipe comes first in a request, before the namespaces */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif
#define PAGEMAP_PRESENT (1ULL << 63)
#define PAGEMAP_FILE_OR_SHARED (1ULL << 61)
#define PAGEMAP_EXCLUSIVE (1ULL << 56)

static int failed(const char *step, char *error, size_t error_len) {
    snprintf(error, error_len, "%s: %s", step, strerror(errno));
    return -1;
}

static int cmp_int(const void *a, const void *b) {
    return *(const int *)a - *(const int *)b;
}

int execbox_contain(const int *fds, int n_ns, const int *ns_types, int n_cgroups, uid_t uid,
                    const struct sock_fprog *filter, char *error, size_t error_len) {
    const char *step;
    if (n_ns < 0 || n_cgroups < 0 || n_ns + n_cgroups + 3 + KEEP > MAX_FDS) {
        errno = EINVAL;
        return failed("malformed request", error, error_len);
    }
    const int *cgroups = fds + n_ns, *stdio = cgroups + n_cgroups, *keep = stdio + 3;
    /* Before anything changes: stdio's sources and the kept descriptors above 0-2 (no dup2
       onto 0-2 can then overwrite one), the kept ones distinct. */
    for (int i = 0; i < 3 + KEEP; i++) {
        int bad = stdio[i] < 3;
        for (int j = 3; j < i; j++)
            bad |= stdio[i] == stdio[j];
        if (bad) {
            errno = EBADF;
            return failed("check the program's descriptors", error, error_len);
        }
    }
    for (int i = 0; i < n_cgroups; i++)
        if (write(cgroups[i], "0", 1) != 1)
            return failed("join cgroup", error, error_len);
    for (int i = 0; i < n_ns; i++) { /* the pid namespace is the zygote's to enter */
        int joined = ns_types[i] & ~CLONE_NEWPID;
        if (joined && setns(fds[i], joined)) {
            /* A pidfd of an init that is gone: its slot was killed from outside after our
               fork, and its namespace kills the rest of it. End as that would have ended us
               (the supervisor then tells that from a set-up that failed). */
            if (errno == ESRCH)
                kill(getpid(), SIGKILL);
            return failed("enter the slot's namespaces", error, error_len);
        }
    }
    for (int i = 0; i < 3; i++)
        if (stdio[i] != i && dup2(stdio[i], i) < 0)
            return failed("set up stdio", error, error_len);
    /* Close everything but 0-2 and the kept descriptors: the gaps between them, in order. */
    int sorted[KEEP + 1], low = 3;
    memcpy(sorted, keep, sizeof(int) * KEEP);
    qsort(sorted, KEEP, sizeof(int), cmp_int);
    sorted[KEEP] = -1;
    for (int i = 0; i <= KEEP; i++) { /* sorted[KEEP] = -1 marks the end: close up to ~0 */
        unsigned int high = sorted[i] < 0 ? ~0U : (unsigned int)sorted[i] - 1;
        if ((sorted[i] < 0 || sorted[i] > low) && syscall(SYS_close_range, low, high, 0))
            return failed("keep only the program's descriptors", error, error_len);
        low = sorted[i] + 1;
    }
    if (chdir("/workspace"))
        return failed("enter /workspace", error, error_len);
    if (execbox_drop_privileges(uid, &step))
        return failed(step, error, error_len);
    umask(022);
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, filter, 0, 0))
        return failed("load seccomp filter", error, error_len);
    return 0;
}

int execbox_written_pages(const uint64_t *ranges, size_t n, int out) {
    long page = sysconf(_SC_PAGESIZE);
    int pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (pagemap < 0 || page <= 0)
        return -1;
    uint64_t entries[512], pairs[256], start = 0, end = 0;
    size_t n_pairs = 0;
    int result = 0;
    for (size_t r = 0; r < n && result == 0; r++) {
        for (uint64_t at = ranges[2 * r]; at < ranges[2 * r + 1] && result == 0;) {
            size_t want = (size_t)((ranges[2 * r + 1] - at) / (uint64_t)page);
            if (want > 512)
                want = 512;
            ssize_t got = pread(pagemap, entries, want * 8, (off_t)(at / (uint64_t)page * 8));
            if (got <= 0) {
                result = -1;
                break;
            }
            for (size_t i = 0; i < (size_t)got / 8; i++, at += (uint64_t)page) {
                uint64_t e = entries[i];
                if ((e & PAGEMAP_PRESENT) && (e & PAGEMAP_EXCLUSIVE) &&
                    !(e & PAGEMAP_FILE_OR_SHARED)) {
                    if (at != end) { /* a new run of pages: the last one is done */
                        if (end > start) {
                            pairs[n_pairs++] = start;
                            pairs[n_pairs++] = end;
                        }
                        start = at;
                    }
                    end = at + (uint64_t)page;
                }
                if (n_pairs == 256) {
                    if (write(out, pairs, sizeof pairs) != (ssize_t)sizeof pairs)
                        result = -1;
                    n_pairs = 0;
                }
            }
        }
    }
    if (end > start) {
        pairs[n_pairs++] = start;
        pairs[n_pairs++] = end;
    }
    if (result == 0 && n_pairs &&
        write(out, pairs, n_pairs * 8) != (ssize_t)(n_pairs * 8))
        result = -1;
    close(pagemap);
    return result;
}

/* Copy the pages of `warm` into this process now (n_warm [start, end) pairs): the ones a
   program of this zygote is known to write first (learned by a training fork, see
   `prefault`). Each would otherwise cost a page fault when first written, on the request
   path; a range this process does not have, or cannot write, is skipped (the copy is only
   ever a head start: contents do not change). */
static void prefault(const uint64_t *warm, size_t n_warm) {
    for (size_t i = 0; i < n_warm; i++)
        madvise((void *)(uintptr_t)warm[2 * i], (size_t)(warm[2 * i + 1] - warm[2 * i]),
                MADV_POPULATE_WRITE);
}

/* Fork a program into the pid namespace `pid_ns` and contain it there. In the parent: the
   child's pid, or -1 with `error` set (nothing was forked), or -2 when the parent could not
   return to its own pid namespace. In the child: 0 once contained; when a contain step fails
   the child reports on its set-up descriptor and exits with 127. */
static pid_t fork_program(int pid_ns, int own_pid_ns, const int *fds, int n_ns,
                          const int *ns_types, int n_cgroups, uid_t uid,
                          const struct sock_fprog *filter, const uint64_t *warm,
                          size_t n_warm, const sigset_t *child_mask, char *error,
                          size_t error_len) {
    if (setns(pid_ns, CLONE_NEWPID))
        return failed("enter the slot's pid namespace", error, error_len);
    pid_t pid = fork();
    if (pid == 0) {
        pthread_sigmask(SIG_SETMASK, child_mask, NULL);
        prctl(PR_SET_NAME, "execbox-program", 0, 0, 0); /* for ps and top; cannot fail */
        if (execbox_contain(fds, n_ns, ns_types, n_cgroups, uid, filter, error, error_len) == 0) {
            prefault(warm, n_warm); /* in the slot's cgroup: the copies are the program's */
            return 0;
        }
        char report[600];
        int len = snprintf(report, sizeof report, "program set-up: contain the program: %s",
                           error);
        if (len > 0) {
            int setup = fds[n_ns + n_cgroups + 3 + KEEP_SETUP];
            size_t n = (size_t)len < sizeof report ? (size_t)len : sizeof report - 1;
            ssize_t written = write(setup, report, n);
            (void)written; /* nothing more to do if it fails: the exit status says set-up */
        }
        _exit(127);
    }
    int fork_errno = errno;
    if (setns(own_pid_ns, CLONE_NEWPID)) {
        failed("return to the zygote's own pid namespace", error, error_len);
        if (pid > 0) { /* never leave a program nobody watches */
            kill(pid, SIGKILL);
            while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                ;
        }
        return -2;
    }
    if (pid < 0) {
        errno = fork_errno;
        return failed("fork the program", error, error_len);
    }
    return pid;
}

/* Write `{"<key>": <text>}` to a status pipe (non-blocking: a supervisor that never reads
   cannot stop the zygote) and close it. `text` is a number, or a string to quote. */
static void report_status(int fd, const char *key, const char *text, int quote) {
    char out[1024];
    size_t n = (size_t)snprintf(out, sizeof out, "{\"%s\": %s", key, quote ? "\"" : "");
    for (const char *c = text; *c && n < sizeof out - 8; c++) {
        if (quote && (*c == '"' || *c == '\\'))
            out[n++] = '\\';
        out[n++] = (unsigned char)*c < 0x20 ? ' ' : *c;
    }
    n += (size_t)snprintf(out + n, sizeof out - n, "%s}", quote ? "\"" : "");
    ssize_t written = write(fd, out, n);
    (void)written;
    close(fd);
}

enum { WARM_BASE = 0, WARM_ALL = 1, WARM_NONE = 2 }; /* `_linux.WARM_*` */

/* "<namespaces> <cgroups> <warm> <uid>": four decimal numbers and nothing else, the first
   three small (warm: 0 for the pages every program writes, 1 for all the warm pages, 2 for
   none), the uid at most ten digits. */
static int parse_layout(const char *msg, size_t len, unsigned long long values[4]) {
    int which = 0, digits = 0;
    values[0] = values[1] = values[2] = values[3] = 0;
    for (size_t i = 0; i < len; i++) {
        if (msg[i] >= '0' && msg[i] <= '9' && digits < (which == 3 ? 10 : 3)) {
            values[which] = values[which] * 10 + (unsigned long long)(msg[i] - '0');
            digits++;
        } else if (msg[i] == ' ' && which < 3 && digits) {
            which++;
            digits = 0;
        } else {
            return -1;
        }
    }
    return which == 3 && digits && values[2] <= WARM_NONE ? 0 : -1;
}

static void close_all(const int *fds, int n) {
    for (int i = 0; i < n; i++)
        close(fds[i]);
}

struct child {
    int pidfd;
    pid_t pid;
    int status_w;
};

/* The living children, kept across calls: a call that returns for a signal (2) comes back to
   the same children. One zygote process, one thread: nothing else touches these. */
static struct child *children;
static struct pollfd *polled;
static size_t n_children, room;

int execbox_serve_programs(int host, int spawn, int own_pid_ns, int n_ns, const int *ns_types,
                           uid_t uid_first, uid_t uid_count, const struct sock_fprog *filter,
                           const uint64_t *warm, size_t n_base, size_t n_warm, int *kept,
                           char *error, size_t error_len) {
    if (uid_first == 0 || uid_count == 0 || uid_first + uid_count < uid_first ||
        uid_first + uid_count > 0x80000000u) { /* never root, never past 2^31 */
        errno = EINVAL;
        return failed("check the uid range", error, error_len);
    }
    if (n_base > n_warm) {
        errno = EINVAL;
        return failed("check the warm pages", error, error_len);
    }
    if (n_ns < 1 || !(ns_types[0] & CLONE_NEWPID) || n_ns + MAX_CGROUPS + 3 + KEEP > MAX_FDS) {
        errno = EINVAL; /* the slot's pid namespace comes first: the fork goes there */
        return failed("check the namespace layout", error, error_len);
    }
    sigset_t all, caller_mask;
    sigfillset(&all);
    if (pthread_sigmask(SIG_BLOCK, &all, &caller_mask))
        return failed("block signals", error, error_len);
    int result = -1;
    for (;;) {
        if (room < n_children + 2) { /* room for one more child, and the first table */
            room = room ? room * 2 : 64;
            struct child *c = realloc(children, room * sizeof *c);
            if (c)
                children = c;
            struct pollfd *p = realloc(polled, (room + 2) * sizeof *p);
            if (p)
                polled = p;
            if (!c || !p) {
                failed("grow the table of children", error, error_len);
                goto out;
            }
        }
        polled[0] = (struct pollfd){.fd = host, .events = POLLIN};
        polled[1] = (struct pollfd){.fd = spawn, .events = POLLIN};
        for (size_t i = 0; i < n_children; i++)
            polled[2 + i] = (struct pollfd){.fd = children[i].pidfd, .events = POLLIN};
        if (ppoll(polled, 2 + n_children, NULL, &caller_mask) < 0) {
            if (errno == EINTR) {
                result = 2; /* the caller runs the signal's handler, then calls again */
                goto out;
            }
            failed("wait for requests", error, error_len);
            goto out;
        }
        /* Ended children first, from the end of the table (each is replaced by the last). */
        for (size_t i = n_children; i-- > 0;) {
            if (!polled[2 + i].revents)
                continue;
            struct child done = children[i];
            children[i] = children[--n_children];
            int status = 0;
            char number[16];
            pid_t reaped;
            while ((reaped = waitpid(done.pid, &status, 0)) < 0 && errno == EINTR)
                ;
            close(done.pidfd);
            if (reaped != done.pid) {
                report_status(done.status_w, "error", "program: its exit status was lost", 1);
                continue;
            }
            snprintf(number, sizeof number, "%d", status);
            report_status(done.status_w, "status", number, 0);
        }
        if (polled[0].revents) {
            char junk[256];
            ssize_t got = recv(host, junk, sizeof junk, MSG_DONTWAIT);
            if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
                result = 0; /* the host is gone */
                goto out;
            }
        }
        if (!polled[1].revents)
            continue;
        char msg[256];
        union {
            struct cmsghdr header;
            char space[CMSG_SPACE(sizeof(int) * MAX_FDS)];
        } control;
        struct iovec iov = {.iov_base = msg, .iov_len = sizeof msg};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.space,
                            .msg_controllen = sizeof control.space};
        ssize_t got = recvmsg(spawn, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (got < 0) {
            if (errno == EAGAIN || errno == EINTR)
                continue;
            failed("read a spawn request", error, error_len);
            goto out;
        }
        int fds[MAX_FDS], n_fds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < n && n_fds < MAX_FDS; i++)
                memcpy(&fds[n_fds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        }
        if (got == 0 && n_fds == 0) {
            result = 0; /* every supervisor's end is gone */
            goto out;
        }
        unsigned long long layout[4]; /* namespaces, cgroups, warm, uid */
        if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
            parse_layout(msg, (size_t)got, layout) || layout[0] != (unsigned)n_ns ||
            layout[1] > MAX_CGROUPS ||
            layout[3] < uid_first || layout[3] - uid_first >= uid_count ||
            n_fds != STATUS_FDS + n_ns + (int)layout[1] + 3 + KEEP) {
            close_all(fds, n_fds); /* malformed: dropped */
            continue;
        }
        int req_cgroups = (int)layout[1];
        uid_t uid = (uid_t)layout[3];
        int status_w = fds[0];
        const int *request = fds + STATUS_FDS; /* namespaces, cgroups, stdio, kept */
        int flags = fcntl(status_w, F_GETFL);
        if (flags < 0 || fcntl(status_w, F_SETFL, flags | O_NONBLOCK)) {
            close_all(fds, n_fds); /* a status pipe that could block us: dropped */
            continue;
        }
        size_t copied = layout[2] == WARM_NONE ? 0 : layout[2] == WARM_ALL ? n_warm : n_base;
        pid_t pid = fork_program(request[0], own_pid_ns, request, n_ns, ns_types, req_cgroups,
                                 uid, filter, warm, copied, &caller_mask, error, error_len);
        if (pid == 0) { /* the child, contained, its signal mask the caller's */
            memcpy(kept, request + n_ns + req_cgroups + 3, sizeof(int) * KEEP);
            return 1;
        }
        close_all(request, n_fds - STATUS_FDS);
        if (pid == -2) {
            close(status_w);
            goto out;
        }
        if (pid < 0) {
            char message[600];
            snprintf(message, sizeof message, "program: %s", error);
            report_status(status_w, "error", message, 1);
            continue;
        }
        int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
        if (pidfd < 0) { /* an unreaped child always has one: never lose track of a program */
            failed("watch the program", error, error_len);
            close(status_w);
            goto out;
        }
        children[n_children++] = (struct child){pidfd, pid, status_w};
    }
out:
    pthread_sigmask(SIG_SETMASK, &caller_mask, NULL);
    return result;
}
