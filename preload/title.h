/* preload/title.h: the process's title, read from its own memory at exit (WIRE_TITLE).
 *
 * Servers name each process by its role by overwriting their argv area (nginx's
 * "nginx: worker process", postgres' "postgres: user db [local] idle"). The service
 * reads /proc/PID/cmdline now and then; a process that takes its title and exits soon
 * after (a worker told to stop, a backend of a short connection) would be gone before it
 * is read, and keep its parent's name. So the client sends the title itself at exit():
 * the session's start learns where the kernel keeps the argv area (/proc/self/stat), and
 * the exit reads it as /proc/PID/cmdline would, from memory, with no system call. */
#ifndef HP_PRELOAD_TITLE_H
#define HP_PRELOAD_TITLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macros.h"

#pragma GCC visibility push(hidden)

/* The kernel's bounds of the argv and environment areas (/proc/PID/stat fields 48-51). */
struct client_title_area {
    uintptr_t arg_start, arg_end, env_start, env_end;
};

/* Parses the @len bytes of a /proc/PID/stat line @buf. Returns 0, or -1 when the line
 * has no such fields (kernels before 3.5) or they make no sense. */
HP_WARN_UNUSED int client_title_parse_stat(const char *buf, size_t len,
                                           struct client_title_area *ret);

/* Copies at most @cap bytes of the title in memory at @a into @out, as the kernel reads
 * /proc/PID/cmdline: the arguments NUL-separated, or, when the last byte of the argv
 * area is no longer a NUL (the program wrote a longer title over it, possibly on into
 * the environment), the string at its start. Returns the bytes copied. */
size_t client_title_copy(const struct client_title_area *a, char *out, size_t cap);

/* Learns the argv area (/proc/self/stat); at a session's start, which may open files. */
void client__title_learn(void);

struct client_session;
/* At exit(): writes the title into @s's ring (WIRE_TITLE), if @s is this process's and
 * its service takes titles. Never waits: a full ring loses it (the service's last read
 * of /proc/PID/cmdline names the process then). */
void client__title_send(struct client_session *s);

#pragma GCC visibility pop

#endif
