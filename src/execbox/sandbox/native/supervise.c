/* A supervisor's per-run steps around its Python, in C: system calls only (see `supervisor`).

   Staging (`stage.c`) was the first of a supervisor's steps moved here; these are the rest of
   its per-run loop that is mostly system calls: the cgroup's counters, the hand-over of a
   staged run to the host (RDY and the short way's offer, PRK), the wait for a run's end and
   the teardown. As Python steps they cost the supervisor's CPU more than the calls themselves:
   its Python runs cold, between two runs of a slot the rest of the machine has the caches.
   What stays in Python reads the requests' JSON, classifies the result and writes it.

   Every function returns -1 with "<step>: <error>" in `error` when a call failed (a protocol
   error as its own message); the others' results are documented with each. The supervisor
   calls them through ctypes (`_linux.SlotSteps`). */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HEADER_LEN 12 /* a frame: 4-byte kind, 8-byte big-endian length (see `protocol`) */
#define TOKEN_HEX 32  /* a run's token: 16 random bytes in hex */
#define MAX_CGROUPS 8
#define MAX_HOST_FDS 4
#define SMALL_FRAME 4096 /* the most a KILL's reason may be */

/* The slot's cgroup counter files, opened once by the supervisor (see `cgroup.RunCgroup`),
   and the file pages the cgroup held at the last peak reset. */
struct counters {
    int cpu_fd;          /* cpuacct.usage (v1, ns) or cpu.stat (v2, usage_usec); -1: none */
    int cpu_v2;
    int oom_fd;          /* memory.oom_control (v1) or memory.events (v2): "oom_kill N" */
    int peak_fd;         /* memory.max_usage_in_bytes (v1) or memory.peak (v2); -1: none */
    int peak_resets;     /* 0: the cgroup is made anew for each run instead (`RunCgroup.renew`) */
    int stat_fd;         /* memory.stat */
    const char *file_keys[2]; /* the file-page counters of memory.stat */
    long long file_base;
};

/* A staged run's baselines, taken once its program waits for its code. */
struct baselines {
    int parked;
    double parked_at;    /* CLOCK_MONOTONIC, as Python's time.monotonic() */
    long long cpu_ns, oom_kills;
    char token[TOKEN_HEX + 1];
};

static int failed(const char *step, char *error, size_t error_len) {
    snprintf(error, error_len, "%s: %s", step, strerror(errno));
    return -1;
}

static double monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A whole counter file (at most size - 1 bytes) into buf, NUL-terminated; its length, or -1. */
static ssize_t read_file(int fd, char *buf, size_t size) {
    ssize_t n;
    while ((n = pread(fd, buf, size - 1, 0)) < 0 && errno == EINTR)
        ;
    if (n >= 0)
        buf[n] = 0;
    return n;
}

/* The number after "<key> " at the start of a line of `text`; 0 when there is none. */
static long long keyed(const char *text, const char *key) {
    size_t len = strlen(key);
    for (const char *line = text; *line;) {
        if (strncmp(line, key, len) == 0 && line[len] == ' ')
            return strtoll(line + len + 1, NULL, 10);
        const char *end = strchr(line, '\n');
        if (!end)
            break;
        line = end + 1;
    }
    return 0;
}

/* The cgroup's CPU time: 0 with no CPU counter (a v1 host without cpuacct), -1 when it
   could not be read. */
static long long cpu_ns(const struct counters *c) {
    char buf[4096];
    if (c->cpu_fd < 0)
        return 0;
    if (read_file(c->cpu_fd, buf, sizeof buf) < 0)
        return -1;
    return c->cpu_v2 ? keyed(buf, "usage_usec") * 1000 : strtoll(buf, NULL, 10);
}

/* The cgroup's OOM kills so far; -1 when they could not be read. */
static long long oom_kills(const struct counters *c) {
    if (c->oom_fd < 0) /* no cgroup (rootless mode without one): none counted */
        return 0;
    char buf[4096];
    if (read_file(c->oom_fd, buf, sizeof buf) < 0)
        return -1;
    return keyed(buf, "oom_kill");
}

/* Page cache charged to the cgroup (see `RunCgroup.file_bytes`); 0 when unreadable. */
static long long file_bytes(const struct counters *c) {
    char buf[16384];
    if (read_file(c->stat_fd, buf, sizeof buf) < 0)
        return 0;
    return keyed(buf, c->file_keys[0]) + keyed(buf, c->file_keys[1]);
}

/* execbox_reset_peak(c)
   Start the peak over, the file pages held now its baseline (see `RunCgroup`). A cgroup whose
   peak cannot be reset is new to this run: its peak has been this run's own from the start. */
void execbox_reset_peak(struct counters *c) {
    ssize_t n = 0;
    while (c->peak_fd >= 0 && c->peak_resets && (n = pwrite(c->peak_fd, "0", 1, 0)) < 0 &&
           errno == EINTR)
        ;
    c->file_base = (c->peak_fd >= 0 && n >= 0) ? file_bytes(c) : 0;
}

/* The run's peak; -1 when the kernel keeps none (cgroup v2 before Linux 5.19), -2 when it
   could not be read. */
static long long memory_peak(const struct counters *c) {
    char buf[64];
    if (c->peak_fd < 0)
        return -1;
    if (read_file(c->peak_fd, buf, sizeof buf) <= 0)
        return -2;
    long long peak = strtoll(buf, NULL, 10);
    if (!c->file_base)
        return peak;
    long long now = file_bytes(c), held = c->file_base < now ? c->file_base : now;
    return peak > held ? peak - held : 0;
}

static int read_exact(int fd, void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? -1 : 1; /* 1: end of file */
        got += (size_t)r;
    }
    return 0;
}

/* One frame of `kind` with `payload` and `fds` (SCM_RIGHTS) on the control socket. */
static int send_frame(int ctrl, const char *kind, const char *payload, size_t len, const int *fds,
                      int n_fds) {
    unsigned char header[HEADER_LEN];
    memcpy(header, kind, 4);
    for (int i = 0; i < 8; i++)
        header[4 + i] = (unsigned char)((uint64_t)len >> (56 - 8 * i));
    struct iovec iov[2] = {{header, HEADER_LEN}, {(void *)payload, len}};
    union {
        struct cmsghdr header;
        char space[CMSG_SPACE(sizeof(int) * MAX_HOST_FDS)];
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
    if (n_fds) {
        mh.msg_control = control.space;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n_fds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n_fds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n_fds);
    }
    size_t total = HEADER_LEN + len, sent = 0;
    while (sent < total) {
        ssize_t n = sendmsg(ctrl, &mh, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        sent += (size_t)n;
        /* Cut short: the descriptors went with the first byte; send the rest plainly. */
        mh.msg_control = NULL;
        mh.msg_controllen = 0;
        size_t skip = (size_t)n;
        for (int i = 0; i < 2; i++) {
            size_t take = skip < iov[i].iov_len ? skip : iov[i].iov_len;
            iov[i].iov_base = (char *)iov[i].iov_base + take;
            iov[i].iov_len -= take;
            skip -= take;
        }
    }
    return 0;
}

/* execbox_hand_over(ctrl, wait_next, host_fds, n_host_fds, error, error_len)
   The staged run to the host: when `wait_next`, first the host's NEXT (frames read until it
   comes; a KILL that raced the end of the last run is stale and skipped), then RDY with the
   host's ends of the run's stdio, which are closed here whatever happens. Returns 1, 0 when
   the host closed the slot before NEXT, or -1. */
int execbox_hand_over(int ctrl, int wait_next, int *host_fds, int n_host_fds, char *error,
                      size_t error_len) {
    int result = 1;
    if (n_host_fds < 0 || n_host_fds > MAX_HOST_FDS) {
        errno = EINVAL;
        result = failed("hand over a staged run", error, error_len);
        goto out;
    }
    while (wait_next) {
        unsigned char header[HEADER_LEN];
        char payload[SMALL_FRAME];
        int r = read_exact(ctrl, header, HEADER_LEN);
        if (r) {
            result = r < 0 ? failed("read the host's NEXT", error, error_len) : 0;
            goto out;
        }
        uint64_t len = 0;
        for (int i = 0; i < 8; i++)
            len = len << 8 | header[4 + i];
        if (memcmp(header, "NEXT", 4) != 0 && memcmp(header, "KILL", 4) != 0) {
            snprintf(error, error_len, "protocol: expected b'NEXT', got b'%.4s'", header);
            result = -1;
            goto out;
        }
        if (len > sizeof payload) {
            snprintf(error, error_len, "protocol: frame b'%.4s' too large: %llu bytes", header,
                     (unsigned long long)len);
            result = -1;
            goto out;
        }
        r = read_exact(ctrl, payload, (size_t)len);
        if (r) {
            result = r < 0 ? failed("read the host's NEXT", error, error_len) : 0;
            goto out;
        }
        wait_next = memcmp(header, "NEXT", 4) != 0;
    }
    if (send_frame(ctrl, "RDY ", "{}", 2, host_fds, n_host_fds))
        result = failed("send RDY", error, error_len);
out:
    for (int i = 0; i < n_host_fds; i++)
        close(host_fds[i]);
    return result;
}

/* execbox_take_parked(done_r, c, b, error, error_len)
   Read what the staged program said (`done_r` is readable): PARKED, and the run's baselines are
   taken into `b` (the peak reset, CPU, OOM kills, a fresh token; returns 1); anything else means
   it ended in set-up (0). -1 when a counter could not be read or no token drawn. */
int execbox_take_parked(int done_r, struct counters *c, struct baselines *b, char *error,
                        size_t error_len) {
    char said = 0;
    ssize_t r;
    while ((r = read(done_r, &said, 1)) < 0 && errno == EINTR)
        ;
    if (r != 1 || said != 'P') /* protocol.PARKED */
        return 0;
    b->parked_at = monotonic();
    execbox_reset_peak(c);
    b->cpu_ns = cpu_ns(c);
    if (b->cpu_ns < 0)
        return failed("read the run's CPU time", error, error_len);
    b->oom_kills = oom_kills(c); /* it only grows: the slot's earlier runs count */
    if (b->oom_kills < 0)
        return failed("read the run's OOM kills", error, error_len);
    /* The exit report must carry it: bytes a program writes blindly into its inherited
       descriptors cannot end its run early. */
    unsigned char raw[TOKEN_HEX / 2];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
        return failed("draw the run's token", error, error_len);
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(b->token + 2 * i, 3, "%02x", raw[i]);
    b->parked = 1;
    return 1;
}

/* execbox_await_parked(done_r, wait_ms, c, b, error, error_len)
   For a request that came the long way: wait at most `wait_ms` for the staged program to say
   it waits for its code, then as `execbox_take_parked` (1: parked, 0: it ended in set-up,
   -1). -2 when it said nothing in time. */
int execbox_await_parked(int done_r, int wait_ms, struct counters *c, struct baselines *b,
                         char *error, size_t error_len) {
    struct pollfd p = {done_r, POLLIN, 0};
    int n;
    while ((n = poll(&p, 1, wait_ms)) < 0 && errno == EINTR)
        ;
    if (n < 0)
        return failed("wait for the program", error, error_len);
    if (n == 0)
        return -2;
    return execbox_take_parked(done_r, c, b, error, error_len);
}

/* execbox_await_request(ctrl, done_r, go_w, c, offer, b, error, error_len)
   Wait for the host's next frame. Meanwhile, unless `b->parked` already, once the staged
   program says it waits for its code take the run's baselines (`execbox_take_parked`) and
   offer the host the short way: PRK with the token and `offer` (the slot's limits as JSON
   members, without braces), carrying `go_w`. A program that ends in set-up instead is left to
   the request's path. Returns 1 when a frame can be read (or the host closed the socket), 0
   when the host closed the slot as the program got ready, or -1. */
int execbox_await_request(int ctrl, int done_r, int go_w, struct counters *c,
                          const char *offer, struct baselines *b, char *error, size_t error_len) {
    struct pollfd fds[2] = {{ctrl, POLLIN, 0}, {b->parked ? -1 : done_r, POLLIN, 0}};
    for (;;) {
        int n = poll(fds, 2, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return failed("wait for a request", error, error_len);
        if (fds[1].revents) {
            fds[1].fd = -1; /* said what it says, or ended */
            int parked = execbox_take_parked(done_r, c, b, error, error_len);
            if (parked < 0)
                return -1;
            if (parked) {
                char payload[512];
                int len = snprintf(payload, sizeof payload, "{\"token\":\"%s\",%s}", b->token,
                                   offer);
                if (len < 0 || (size_t)len >= sizeof payload) {
                    errno = EOVERFLOW;
                    return failed("offer the short way", error, error_len);
                }
                if (send_frame(ctrl, "PRK ", payload, (size_t)len, &go_w, 1))
                    return (errno == EPIPE || errno == ECONNRESET)
                               ? 0 : failed("offer the short way", error, error_len);
            }
        }
        if (fds[0].revents)
            return 1;
    }
}

/* A run being watched (see `execbox_watch`). */
struct watch {
    int done_r, status_r, ctrl;
    double deadline, next_cpu_check, cpu_s; /* CLOCK_MONOTONIC; the run's CPU limit in s */
    long long cpu_base;
    const char *token;
    char tail[TOKEN_HEX];  /* the last bytes read, for a token split across two reads */
    int tail_len;
    long long junk;        /* bytes read from done_r so far */
    int status;            /* the reported wait status */
};

enum { WATCH_REPORTED = 1, WATCH_ENDED, WATCH_HOST, WATCH_TIMEOUT, WATCH_CPU };

#define DONE_JUNK_LIMIT (64 << 10) /* bytes read from done_r before we stop listening */

/* execbox_watch(w, c, error, error_len)
   Wait for the run's end: its exit report on `done_r` (the token, then one byte of exit
   status: WATCH_REPORTED, `w->status` set), its zygote's report of its end on `status_r`
   (WATCH_ENDED: no report of its own), a frame from the host (WATCH_HOST: the caller reads
   it and calls again), the wall deadline (WATCH_TIMEOUT) or the CPU limit, checked as often as
   the cores could have used it up (WATCH_CPU). A program that closes `done_r` without a
   report, or floods it, is no longer read: its exit status then comes from `status_r`.
   When several are ready at once the report comes first: the program is done, and the rest of
   the run ends with init at once (the zygote's report would have the supervisor wait for
   init's end first). A program can forge its report (its token is in its own memory) and so
   lie about its own exit status, as it could by exiting with that status. */
int execbox_watch(struct watch *w, const struct counters *c, char *error, size_t error_len) {
    cpu_set_t set;
    int ncpu = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1; /* may change */
    if (ncpu < 1)
        ncpu = 1;
    size_t token_len = strlen(w->token);
    struct pollfd fds[3] = {{w->status_r, POLLIN, 0}, {w->ctrl, POLLIN, 0},
                            {w->junk > DONE_JUNK_LIMIT ? -1 : w->done_r, POLLIN, 0}};
    for (;;) {
        double now = monotonic();
        if (now >= w->deadline)
            return WATCH_TIMEOUT;
        if (now >= w->next_cpu_check) {
            long long now_ns = cpu_ns(c);
            if (now_ns < 0)
                return failed("read the run's CPU time", error, error_len);
            double used = (double)(now_ns - w->cpu_base) / 1e9;
            if (used >= w->cpu_s)
                return WATCH_CPU;
            double wait = (w->cpu_s - used) / ncpu;
            w->next_cpu_check = now + (wait > 0.01 ? wait : 0.01);
        }
        double until = w->deadline < w->next_cpu_check ? w->deadline : w->next_cpu_check;
        int n = poll(fds, 3, (int)((until - now) * 1000) + 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return failed("watch the run", error, error_len);
        if (fds[2].revents) {
            char data[65536 + TOKEN_HEX];
            memcpy(data, w->tail, (size_t)w->tail_len);
            ssize_t r = read(w->done_r, data + w->tail_len, 65536);
            if (r < 0 && (errno == EAGAIN || errno == EINTR))
                r = -2;
            if (r != -2) {
                w->junk += r > 0 ? r : 0;
                if (r <= 0 || w->junk > DONE_JUNK_LIMIT) {
                    /* Closed without a report, or flooded: stop reading (the flood then
                       blocks the writer, at no cost to us). */
                    w->junk = DONE_JUNK_LIMIT + 1;
                    fds[2].fd = -1;
                } else {
                    size_t len = (size_t)w->tail_len + (size_t)r;
                    char *at = memmem(data, len, w->token, token_len);
                    if (at && (size_t)(at - data) + token_len < len) {
                        w->status = (unsigned char)at[token_len] << 8;
                        return WATCH_REPORTED;
                    }
                    size_t keep = len < token_len ? len : token_len;
                    memcpy(w->tail, data + len - keep, keep);
                    w->tail_len = (int)keep;
                }
            }
        }
        if (fds[0].revents)
            return WATCH_ENDED;
        if (fds[1].revents)
            return WATCH_HOST;
    }
}

/* What a run left to read once it ended (see `execbox_collect`). */
struct collected {
    long long cpu_ns, oom_kills, memory_peak;
    size_t err_len, setup_len;
    long long workspace_inodes; /* in use on /workspace, its root's included; -1: unknown */
};

/* Read what is in a pipe now, at most `size` bytes; how many. The supervisor's ends are
   non-blocking (`stage.c`): a read never waits for the run's writers to end. */
static size_t read_available(int fd, char *buf, size_t size) {
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, buf + got, size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    return got;
}

/* execbox_collect(c, err_r, err, err_size, setup_r, setup, setup_size, out, error, error_len)
   After the run: what is in its error and set-up pipes (at most the buffers' sizes), the
   cgroup's counters, and how many inodes /workspace holds (a fresh tmpfs holds one, its root:
   with no inputs, 1 means no file to collect). Returns 0, or -1 when a counter could not be
   read. */
int execbox_collect(const struct counters *c, int err_r, char *err, size_t err_size,
                    int setup_r, char *setup, size_t setup_size, struct collected *out,
                    char *error, size_t error_len) {
    out->err_len = read_available(err_r, err, err_size);
    out->setup_len = read_available(setup_r, setup, setup_size);
    out->oom_kills = oom_kills(c);
    if (out->oom_kills < 0)
        return failed("read the run's OOM kills", error, error_len);
    out->cpu_ns = cpu_ns(c);
    if (out->cpu_ns < 0)
        return failed("read the run's CPU time", error, error_len);
    out->memory_peak = memory_peak(c);
    if (out->memory_peak == -2)
        return failed("read the run's memory peak", error, error_len);
    struct statvfs v;
    out->workspace_inodes = statvfs("/workspace", &v) == 0 && v.f_files > 0
                                ? (long long)(v.f_files - v.f_ffree) : -1;
    return 0;
}

/* execbox_end_init(pid, wait_ms)
   Kill init, and with it everything in the run's pid namespace, and reap it, waiting at most
   `wait_ms` (init's exit waits until every process of the namespace is reaped). */
void execbox_end_init(int pid, int wait_ms) {
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0)
        return; /* already reaped */
    if (syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0) == 0 || errno == ESRCH) {
        struct pollfd p = {pidfd, POLLIN, 0};
        int n;
        while ((n = poll(&p, 1, wait_ms)) < 0 && errno == EINTR)
            ;
        if (n > 0)
            while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                ;
    }
    close(pidfd);
}

/* execbox_cgroup_has_processes(cgroup_dirs, n_cgroups, error, error_len)
   Whether any process is in the cgroup, in any of its controllers' directories: 1, 0, or -1
   when a cgroup.procs could not be read. Opened afresh each time: a kept descriptor of
   cgroup.procs reads its first list again. */
int execbox_cgroup_has_processes(const int *cgroup_dirs, int n_cgroups, char *error,
                                 size_t error_len) {
    for (int i = 0; i < n_cgroups; i++) {
        int fd = openat(cgroup_dirs[i], "cgroup.procs", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return failed("check the cgroup is empty", error, error_len);
        char buf[64];
        ssize_t n;
        while ((n = read(fd, buf, sizeof buf)) < 0 && errno == EINTR)
            ;
        close(fd);
        if (n < 0)
            return failed("check the cgroup is empty", error, error_len);
        for (ssize_t j = 0; j < n; j++)
            if (buf[j] != ' ' && buf[j] != '\n' && buf[j] != '\t')
                return 1;
    }
    return 0;
}

/* execbox_end_run(init_pid, wait_ms, fds, n_fds, cgroup_dirs, n_cgroups, error, error_len)
   Everything of the run gone: init and with it its processes (see `execbox_end_init`), its
   descriptors (closed), its /proc (unmounted). Returns 0 when the cgroup is then empty, 1 when
   processes of the run survived (`execbox_cgroup_has_processes`), -1 on a failed step. */
int execbox_end_run(int init_pid, int wait_ms, const int *fds, int n_fds,
                    const int *cgroup_dirs, int n_cgroups, char *error, size_t error_len) {
    if (init_pid > 0)
        execbox_end_init(init_pid, wait_ms);
    for (int i = 0; i < n_fds; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    if (umount2("/proc", MNT_DETACH))
        return failed("unmount the run's /proc", error, error_len);
    return execbox_cgroup_has_processes(cgroup_dirs, n_cgroups, error, error_len);
}
