/* service/client.c: the lifetime of a client object (struct svc_client, svc_internal.h):
 * built by the handshake on the main thread, handed to an unwinder thread, freed by
 * whichever thread owns it then. Kept apart from the handshake so that the threads that
 * free or name a client do not call into the handshake's file. */
#include "service/svc_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct svc_client *svc__client_new(pid_t pid)
{
    struct svc_client *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->sock = c->maps_fd = c->mem_fd = c->image_fd = -1;
    c->pid = pid;
    return c;
}

struct svc_client *svc__client_free(struct svc_client *c)
{
    if (!c)
        return NULL;
    if (c->sock >= 0)
        (void)close(c->sock);
    if (c->maps_fd >= 0)
        (void)close(c->maps_fd);
    if (c->mem_fd >= 0)
        (void)close(c->mem_fd);
    if (c->image_fd >= 0)
        (void)close(c->image_fd);
    c->unw = unwinder_process_free(c->unw);
    c->ring = ring_unmap(c->ring);
    free(c->cmdline);
    free(c->forked);
    free(c);
    return NULL;
}

#define MAX_CMDLINE 4096

/* Ends the command line or title @buf (@*len bytes, room for one more) as the service
 * keeps it: a retitled process pads its title to the length of its old argv area with
 * NULs or spaces (postgres, nginx), not part of its name; then one NUL. */
static void cmdline_end(char *buf, size_t *len)
{
    size_t n = *len;
    while (n > 0 && (buf[n - 1] == '\0' || buf[n - 1] == ' '))
        n--;
    if (n > 0)
        buf[n++] = '\0';
    *len = n;
}

int svc__read_cmdline(pid_t pid, char **ret, size_t *ret_len)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    HP_CLEANUP_CLOSE int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    char *buf = malloc(MAX_CMDLINE + 1);
    if (!buf)
        return -ENOMEM;
    size_t len = 0;
    while (len < MAX_CMDLINE) {
        ssize_t n = read(fd, buf + len, MAX_CMDLINE - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    cmdline_end(buf, &len);
    *ret = buf;
    *ret_len = len;
    return 0;
}

void svc__client_set_title(struct svc_client *c)
{
    c->title[0] = '\0';
    /* Spaces in argv[0]: a title, not a path (its basename would be a word of it). */
    size_t a0 = c->cmdline ? strnlen(c->cmdline, c->cmdline_len) : 0;
    if (a0 && memchr(c->cmdline, ' ', a0))
        (void)svc_cmdline_title(c->cmdline, c->cmdline_len, c->title, sizeof(c->title));
}

/* Names @c by @cmdline (@len bytes, cmdline_end(); malloc'd, taken) from now on, if it
 * is another. */
static void client_rename(struct svc_unwinder *u, struct svc_client *c, char *cmdline, size_t len)
{
    if (len == 0 || (len == c->cmdline_len && memcmp(cmdline, c->cmdline, len) == 0)) {
        free(cmdline);
        return;
    }
    struct svc_msg_proc_rename *m = svc__post(u, c, SVC_MSG_PROC_RENAME, sizeof(*m) + len);
    if (!m) {
        free(cmdline); /* the queue is out of memory: the next look tries again */
        return;
    }
    m->cmdline_len = (uint32_t)len;
    memcpy(m + 1, cmdline, len);
    free(c->cmdline);
    c->cmdline = cmdline;
    c->cmdline_len = len;
    svc__client_set_title(c);
}

void svc__client_retitle(struct svc_unwinder *u, struct svc_client *c)
{
    char *cmdline;
    size_t len;
    /* An ending or exited process reads empty: it keeps the name it had. A process that
     * exec'd is another program, whose command line is not this session's title: the
     * kernel let the old address space go at the exec, so the maps file the client gave
     * us reads nothing (as hangup_flags() tells an exec from a closed connection). */
    char b;
    if (c->ending || (c->image_fd >= 0 && pread(c->image_fd, &b, 1, 0) != 1) ||
        svc__read_cmdline(c->pid, &cmdline, &len) < 0)
        return;
    client_rename(u, c, cmdline, len);
}

void svc__client_title_record(struct svc_unwinder *u, struct svc_client *c, const uint8_t *data,
                              size_t len)
{
    if (len == 0 || len > WIRE_TITLE_MAX) {
        c->flags |= BK_FLAG_BUFFER_CORRUPTED;
        return;
    }
    char *cmdline = malloc(len + 1);
    if (!cmdline)
        return;
    memcpy(cmdline, data, len);
    cmdline_end(cmdline, &len);
    client_rename(u, c, cmdline, len);
}

const char *svc__client_name(const struct svc_client *c)
{
    if (!c->cmdline || !c->cmdline_len || !c->cmdline[0])
        return "?";
    if (c->title[0])
        return c->title;
    const char *slash = strrchr(c->cmdline, '/');
    return slash && slash[1] ? slash + 1 : c->cmdline;
}
