/* preload/peer.h: whom the client hands its /proc/self/maps and /proc/self/mem (internal).
 *
 * Those descriptors let their holder read all of the program's memory, what a ptrace
 * attach would give. So the peer of a handshake must be one the kernel would let trace
 * us anyway, and, when we know who asked for the session, that very process:
 *
 *   always       its uid (SO_PEERCRED) is ours or root; another user's process only
 *                stops profiling (a squatted runtime directory, say).
 *   wake         the attacher that woke us passed its pid (preload/wake.c): the peer must
 *                be that process. It had to ptrace us to wake us, so the kernel let it;
 *                another process of our uid listening on the attacher's socket path (it
 *                may unlink and bind the attacher's name) gets nothing.
 *   wake from outside  an attacher in another pid namespace (a container's host) made a
 *                socket for us inside our root and passed its path; it cannot be seen from
 *                here, so the peer must be a process we cannot see either (SO_PEERCRED pid
 *                0: it lives outside our pid namespace). A process of our container that
 *                put its own socket at that path is visible, and gets nothing.
 *   daemon wake  a wake with no pid (the daemon's socket): under Yama's ptrace_scope 1,
 *                only root, a process with CAP_SYS_PTRACE in our user namespace or an
 *                ancestor of ours (what Yama lets trace us; a ptracer the program declared
 *                with PR_SET_PTRACER cannot be seen from here and is refused); under 2 and
 *                3 root or CAP_SYS_PTRACE only. The waker itself passed that rule, so a
 *                real daemon passes it too; someone else's socket at its path does not.
 *                Without Yama (scope 0), the uid rule is what ptrace applies too.
 *   followed fork  the child handshakes with the process its parent's session was with.
 *   startup      the socket the program was started with (HEAPPROF_SOCKET, or the user's
 *                own runtime directory): the uid rule only. The user chose it when starting
 *                the program; with Yama that service is often not an ancestor (a user's
 *                daemon), and refusing it would end startup profiling there.
 *
 *     struct client_peer p = {.self_uid = getuid(), .uid = cred.uid, .pid = cred.pid,
 *                             .want_pid = attacher, .woken = true, .yama_scope = -1};
 *     if (!client_peer_trusted(&p)) refuse();
 *
 * Raw system calls only (the session thread has no glibc state); no allocation.
 */
#ifndef HP_PRELOAD_PEER_H
#define HP_PRELOAD_PEER_H

#include <stdbool.h>
#include <sys/types.h>

#pragma GCC visibility push(hidden)

/* What the client knows of the peer of a handshake, and what it asked for. */
struct client_peer {
    uid_t self_uid;
    uid_t uid;       /* SO_PEERCRED */
    pid_t pid;       /* SO_PEERCRED; 0 when it lives in a pid namespace we cannot see */
    pid_t want_pid;  /* > 0: only this process may be the peer; CLIENT_PEER_HIDDEN: only
                        one outside our pid namespace */
    bool woken;      /* the session was asked for by a wake (Yama's rule applies) */
    int yama_scope;  /* /proc/sys/kernel/yama/ptrace_scope; -1: no Yama */
    bool cap_ptrace; /* the peer has CAP_SYS_PTRACE, in our user namespace */
    bool ancestor;   /* the peer is an ancestor of ours */
};

/* want_pid of a wake from outside our pid namespace. */
#define CLIENT_PEER_HIDDEN (-1)

/* True when @p may have our descriptors (the rules above). Pure. */
bool client_peer_trusted(const struct client_peer *p);

/* True when @p needs client_peer_trusted() to know cap_ptrace and ancestor. Pure. */
bool client_peer_needs_ptrace_facts(const struct client_peer *p);

/* Yama's ptrace_scope, or -1 without Yama (or when unreadable). */
int client_peer_yama_scope(void);

/* True when process @pid is our parent, or its parent, and so on. */
bool client_peer_is_ancestor(pid_t pid);

/* True when process @pid has CAP_SYS_PTRACE in its effective set and lives in our user
 * namespace (a capability of a namespace of its own gives it nothing over us). */
bool client_peer_has_cap_ptrace(pid_t pid);

#pragma GCC visibility pop

#endif
