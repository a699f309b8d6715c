/* libexecbox-contain: the steps that contain a program, in one call from its fresh fork.

   A program is a fork of a program zygote, a big interpreter whose pages the fork shares:
   every Python step in the child copies the pages of every object it touches. These steps
   are system calls only, so they run here, where they touch a few pages of C stack instead
   (see `program` and `jail`, which load and call this through ctypes).

   execbox_contain(fds, n_ns, ns_types, n_cgroups, uid, filter, error, error_len):
     fds       the request's descriptors: n_ns namespaces (ns_types[i] is the CLONE_NEW* flag of
               fds[i]; CLONE_NEWPID is skipped, the zygote forked us into it), n_cgroups
               cgroup.procs files, then stdin, stdout, stderr, then KEEP descriptors the
               program keeps at their numbers
     uid       the unprivileged uid to become
     filter    the seccomp program (struct sock_fprog), installed last
   In order: join the cgroup, join the namespaces (the mount namespace last: root and working
   directory become the jail's), stdio on 0-2, every other descriptor closed, /workspace,
   privileges dropped (privileges.h), umask 022, seccomp. Returns 0, or -1 with
   "<step>: <error>" in `error`.

   Built by `execbox image build` into the runtime image's libexec/. */

#include "privileges.h"

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#define KEEP 4 /* go, error, set-up error and exit report: see program.ProgramFds */
#define MAX_FDS 64

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
    for (int i = 0; i < n_ns; i++)
        if (ns_types[i] != CLONE_NEWPID && setns(fds[i], ns_types[i]))
            return failed("enter the slot's namespaces", error, error_len);
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
