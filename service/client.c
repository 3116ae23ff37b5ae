/* service/client.c: the lifetime of a client object (struct svc_client, svc_internal.h):
 * built by the handshake on the main thread, handed to an unwinder thread, freed by
 * whichever thread owns it then. Kept apart from the handshake so that the threads that
 * free or name a client do not call into the handshake's file. */
#include "service/svc_internal.h"

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

const char *svc__client_name(const struct svc_client *c)
{
    if (!c->cmdline || !c->cmdline_len || !c->cmdline[0])
        return "?";
    if (c->title[0])
        return c->title;
    const char *slash = strrchr(c->cmdline, '/');
    return slash && slash[1] ? slash + 1 : c->cmdline;
}
