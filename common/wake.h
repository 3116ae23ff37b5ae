/* common/wake.h: the advertisement page of a dormant client, which an attacher reads to
 * wake it with a remote call (preload/wake.c writes it, service/wake.c reads it).
 *
 * A dormant process maps one read-only page of a memfd named HP_WAKE_MEMFD_NAME; its
 * first bytes are a struct hp_wake_page. The attacher finds the mapping in
 * /proc/PID/maps, reads the page (process_vm_readv, the same permission as ptrace), and
 * checks the magic and the version before it trusts the two addresses:
 *
 *     struct hp_wake_page pg;          // read from the mapping's start
 *     if (pg.magic == HP_WAKE_MAGIC && pg.version == HP_WAKE_VERSION)
 *         remote call pg.entry(attacher pid, socket path or NULL), returning to pg.trap
 *
 * The page is written by the target itself: it is trusted only as far as the target is
 * (the attacher may trace it anyway); the addresses are checked against the target's
 * executable mappings of libheapprof.so before use. Fixed-width little-endian fields. */
#ifndef HP_COMMON_WAKE_H
#define HP_COMMON_WAKE_H

#include <stddef.h>
#include <stdint.h>

/* /proc/PID/maps shows "/memfd:heapprof-attach-wake (deleted)". No digits after the
 * prefix: attachers of the signal era read a number there (the signal to send) and
 * treat this page as "no handler", so they never signal a process that has none. */
#define HP_WAKE_MEMFD_NAME "heapprof-attach-wake"
#define HP_WAKE_MAGIC 0x656b6177706168ull /* "hapwake\0" */
#define HP_WAKE_VERSION 1u

struct hp_wake_page {
    uint64_t magic;   /* HP_WAKE_MAGIC */
    uint32_t version; /* HP_WAKE_VERSION */
    uint32_t size;    /* sizeof(struct hp_wake_page) */
    /* int client_wake_entry(int attacher_pid, const char *sock_path): async-signal-safe,
     * returns normally, with one of the HP_WAKE_* answers below (rax at the trap). */
    uint64_t entry;
    /* An int3: the remote call returns here, the tracer sees SIGTRAP with rip = trap + 1. */
    uint64_t trap;
    /* HP_WAKE_FEATURE_* bits; only when size covers it (pages of older clients end at
     * trap: no features). */
    uint64_t features;
};
/* The entry takes a socket path (NUL-terminated, at most HP_WAKE_PATH_MAX bytes with its
 * NUL; NULL: the attacher's own, derived from its pid): the one to connect to, made by an
 * attacher outside the process's namespaces (a container) inside its root. With a path,
 * attacher_pid is the attacher's pid as the process sees it, 0 when it lives outside the
 * process's pid namespace: the peer must then be such a process (SO_PEERCRED pid 0). */
#define HP_WAKE_FEATURE_PATH 1ull
#define HP_WAKE_PATH_MAX 108 /* sizeof(struct sockaddr_un.sun_path) */
/* The entry's answer: what the attacher tells its user. */
#define HP_WAKE_STARTED 0      /* the session thread is on its way to the attacher */
#define HP_WAKE_FAILED (-1)    /* the session thread could not be started */
#define HP_WAKE_BUSY (-2)      /* another attach request is being served: try again */
#define HP_WAKE_PROFILED (-3)  /* in a session already, its service unknown */
#define HP_WAKE_NOT_OWNER (-4) /* a vfork child of the program (its memory, not its state) */
/* > 0: in a session already, with the service of that pid (the peer of its socket). */

_Static_assert(sizeof(struct hp_wake_page) == 40, "hp_wake_page ABI");
_Static_assert(offsetof(struct hp_wake_page, entry) == 16, "hp_wake_page ABI");
_Static_assert(offsetof(struct hp_wake_page, trap) == 24, "hp_wake_page ABI");
_Static_assert(offsetof(struct hp_wake_page, features) == 32, "hp_wake_page ABI");
/* The size of a page without the features field. */
#define HP_WAKE_PAGE_MIN_SIZE 32u

#endif
