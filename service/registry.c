/* service/registry.c: the registry of pids: those that completed a handshake (marked by
 * the main thread, service/listener.c) and those whose clients are fully drained (marked
 * by the bookkeeping thread, service/bk_thread.c), asked by the owner of the session
 * (svc_client_seen(), svc_client_done()). Thread-safe: both sets are under done_lock. */
#include "service/svc_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

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

/* The parent of @pid (/proc/PID/stat), or 0. */
static pid_t parent_of(pid_t pid)
{
    char path[64], buf[512];
    size_t n = 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if (svc__read_small(path, buf, sizeof(buf) - 1, &n) < 0)
        return 0;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    char state;
    int ppid = 0;
    if (!p || sscanf(p + 1, " %c %d", &state, &ppid) != 2)
        return 0;
    return (pid_t)ppid;
}

void svc__note_child(struct svc *s, const struct svc_client *c)
{
    if (!c->from_startup)
        return;
    pid_t ppid = parent_of(c->pid);
    if (ppid <= 1 || !svc_client_seen(s, ppid))
        return;
    pthread_mutex_lock(&s->done_lock);
    uint64_t *v;
    if (hp_map_put(&s->exec_children, (uint64_t)(uint32_t)ppid, (void **)&v) >= 0)
        (*v)++;
    pthread_mutex_unlock(&s->done_lock);
}

uint64_t svc__forks_unfollowed(struct svc *s, pid_t pid, uint64_t forks)
{
    pthread_mutex_lock(&s->done_lock);
    uint64_t *v = hp_map_get(&s->exec_children, (uint64_t)(uint32_t)pid);
    uint64_t execd = v ? *v : 0;
    if (v)
        hp_map_remove_value(&s->exec_children, v);
    pthread_mutex_unlock(&s->done_lock);
    return forks > execd ? forks - execd : 0;
}
