/* The privilege drop shared by init (init.c) and the program (contain.c): no capabilities in
   any set, root's special treatment locked out, an unprivileged uid (never 0, checked after
   the switch) and the same gid, no groups, no_new_privs.
   Returns 0, or -1 with errno set and *step naming what failed. */

#ifndef EXECBOX_PRIVILEGES_H
#define EXECBOX_PRIVILEGES_H

#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

/* keep-caps locked, no setuid fix-up (locked), no root privileges (locked) */
#define EXECBOX_SECUREBITS_LOCKED_DOWN \
    ((1 << 0) | (1 << 1) | (1 << 3) | (1 << 5) | (1 << 6) | (1 << 7))

static int execbox_drop_privileges(uid_t uid, const char **step) {
    *step = "check the unprivileged uid";
    if (uid == 0 || uid == (uid_t)-1) { /* root, or "leave unchanged" */
        errno = EINVAL;
        return -1;
    }
    /* Normally empty already: a program zygote empties it once, for every fork. */
    *step = "drop the capability bounding set";
    for (int cap = 0;; cap++) {
        int held = prctl(PR_CAPBSET_READ, cap, 0, 0, 0); /* < 0 past the last capability */
        if (held < 0)
            break;
        if (held == 1 && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0))
            return -1;
    }
    *step = "lock capabilities out";
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) ||
        prctl(PR_SET_SECUREBITS, EXECBOX_SECUREBITS_LOCKED_DOWN, 0, 0, 0))
        return -1;
    *step = "switch to the unprivileged uid";
    /* EPERM with CAP_SETGID held: a user namespace whose setgroups is "deny" (rootless
       mode, see `native/enter.c`), where the caller's own groups cannot be dropped. */
    int kept_groups = setgroups(0, NULL) != 0;
    if (kept_groups && errno != EPERM)
        return -1;
    if (setresgid(uid, uid, uid) || setresuid(uid, uid, uid))
        return -1;
    uid_t r, e, s;
    gid_t rg, eg, sg;
    if (getresuid(&r, &e, &s) || getresgid(&rg, &eg, &sg))
        return -1;
    if (r != uid || e != uid || s != uid || rg != uid || eg != uid || sg != uid ||
        (!kept_groups && getgroups(0, NULL) != 0)) {
        errno = EPERM;
        return -1;
    }
    *step = "clear capabilities";
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &header, data))
        return -1;
    *step = "set no_new_privs";
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
        return -1;
    return 0;
}

#endif
