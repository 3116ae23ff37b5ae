/* service/registry.c: the registry of pids: those that completed a handshake (marked by
 * the main thread, service/listener.c), those whose session began to end (by their
 * unwinder thread) and those whose clients are fully drained (by the bookkeeping thread,
 * service/bk_thread.c), asked by the owner of the session (svc_client_seen(),
 * svc_client_ended(), svc_client_done()). Thread-safe: the sets are under done_lock. */
#include "service/svc_internal.h"

#include <pthread.h>

/* A set of pids (the registry's seen and done sets). Caller holds done_lock. A pid that
 * finds no room is not recorded: its waiter then waits out its own timeout. */
static void pids_add_locked(struct hp_map *set, pid_t pid)
{
    void *v;
    (void)!hp_map_put(set, (uint64_t)(uint32_t)pid, &v);
}

static bool pids_has(struct svc *s, const struct hp_map *set, pid_t pid)
{
    pthread_mutex_lock(&s->done_lock);
    bool found = hp_map_get(set, (uint64_t)(uint32_t)pid) != NULL;
    pthread_mutex_unlock(&s->done_lock);
    return found;
}

void svc__mark_done(struct svc *s, pid_t pid)
{
    pthread_mutex_lock(&s->done_lock);
    pids_add_locked(&s->done, pid);
    pthread_mutex_unlock(&s->done_lock);
}

bool svc_client_done(svc_t *s, pid_t pid)
{
    return pids_has(s, &s->done, pid);
}

void svc__mark_seen(struct svc *s, pid_t pid)
{
    pthread_mutex_lock(&s->done_lock);
    pids_add_locked(&s->seen, pid);
    pthread_mutex_unlock(&s->done_lock);
}

bool svc_client_seen(svc_t *s, pid_t pid)
{
    return pids_has(s, &s->seen, pid);
}

void svc__mark_ending(struct svc *s, pid_t pid)
{
    pthread_mutex_lock(&s->done_lock);
    pids_add_locked(&s->ending, pid);
    pthread_mutex_unlock(&s->done_lock);
}

bool svc_client_ended(svc_t *s, pid_t pid)
{
    return pids_has(s, &s->ending, pid) || pids_has(s, &s->done, pid);
}
