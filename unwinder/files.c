/* unwinder/files.c: opening the files clients name (the paths of their mappings, the
 * debug links next to them), so that no path a client chooses can hang an unwinder
 * thread or make it read something else.
 *
 * A client can put anything at a path it names: a symlink to a file only we may read, a
 * FIFO (open(2) waits for a writer), a device (opening a tape rewinds it), or a file on a
 * NFS or FUSE mount that stopped answering, where even stat(2) sleeps uninterruptibly.
 * So the path is opened with O_PATH (no open of the file itself, no wait on a FIFO) and
 * without following a last-component symlink, checked with fstat (a regular file, the
 * inode the maps named), and only then opened for reading through /proc/self/fd, which
 * reopens that very inode. All of it runs on a short-lived helper thread; the caller waits
 * at most unwinder__open_timeout_ms and then gives up, leaving the helper to close what it
 * may still get. Stuck helpers are counted, and past UNWINDER_OPEN_MAX_STUCK new opens
 * fail at once rather than pile up threads.
 *
 * A thread per open: files are opened once each (the caches keep them), so this costs
 * tens of microseconds a few hundred times a session, and one hung open never queues
 * the others behind it.
 */
#include "unwinder/unwinder_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

unsigned unwinder__open_timeout_ms = 1000;

/* A request, shared by the caller and its helper; the last one to let go frees it. */
struct open_req {
    bool follow;
    uint64_t inode;
    int result; /* the fd or -errno, once done */
    struct stat st;
    bool done, abandoned; /* under s_lock */
    char path[];
};

static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t s_cond = PTHREAD_COND_INITIALIZER;
static unsigned s_running;      /* helpers not finished, under s_lock */
static atomic_ulong s_timeouts; /* relaxed: a statistic */

unsigned long unwinder__open_timeouts(void)
{
    return atomic_load_explicit(&s_timeouts, memory_order_relaxed);
}

static int open_now(const char *path, bool follow, uint64_t inode, struct stat *ret_st)
{
    int o = open(path, O_PATH | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
    if (o < 0)
        return -errno;
    struct stat st;
    int r;
    if (fstat(o, &st) < 0) {
        r = -errno;
    } else if (S_ISLNK(st.st_mode)) {
        r = -ELOOP; /* O_PATH | O_NOFOLLOW opens the link itself */
    } else if (!S_ISREG(st.st_mode)) {
        r = -EINVAL;
    } else if (inode && st.st_ino != inode) {
        /* The device is not compared: on overlayfs, stat() and /proc/PID/maps disagree
         * on it. */
        r = -ESTALE;
    } else {
        char self[64];
        snprintf(self, sizeof(self), "/proc/self/fd/%d", o);
        r = open(self, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (r < 0)
            r = -errno;
        else
            *ret_st = st;
    }
    (void)close(o);
    return r;
}

static void *open_main(void *arg)
{
    struct open_req *q = arg;
    struct stat st;
    int r = open_now(q->path, q->follow, q->inode, &st);
    pthread_mutex_lock(&s_lock);
    bool abandoned = q->abandoned;
    q->result = r;
    q->st = st;
    q->done = true;
    s_running--;
    pthread_cond_broadcast(&s_cond);
    pthread_mutex_unlock(&s_lock);
    if (abandoned) {
        if (r >= 0)
            (void)close(r);
        free(q);
    }
    return NULL;
}

int unwinder__open_file(const char *path, bool follow, uint64_t inode, struct stat *ret_st)
{
    size_t len = strlen(path);
    struct open_req *q = calloc(1, sizeof(*q) + len + 1);
    if (!q)
        return -ENOMEM;
    memcpy(q->path, path, len + 1);
    q->follow = follow;
    q->inode = inode;

    pthread_mutex_lock(&s_lock);
    if (s_running >= UNWINDER_OPEN_MAX_STUCK) {
        pthread_mutex_unlock(&s_lock);
        free(q);
        atomic_fetch_add_explicit(&s_timeouts, 1, memory_order_relaxed);
        return -ETIMEDOUT;
    }
    s_running++;
    pthread_mutex_unlock(&s_lock);

    pthread_attr_t attr;
    pthread_t t;
    int e = pthread_attr_init(&attr);
    if (e == 0) {
        (void)pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        (void)pthread_attr_setstacksize(&attr, 64 << 10);
        e = pthread_create(&t, &attr, open_main, q);
        pthread_attr_destroy(&attr);
    }
    if (e != 0) {
        /* No thread to spare: open here, unprotected from a hung mount but not from the
         * rest. */
        pthread_mutex_lock(&s_lock);
        s_running--;
        pthread_mutex_unlock(&s_lock);
        int r = open_now(path, follow, inode, ret_st);
        free(q);
        return r;
    }

    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    uint64_t ns = (uint64_t)deadline.tv_nsec + (uint64_t)unwinder__open_timeout_ms * 1000000u;
    deadline.tv_sec += (time_t)(ns / 1000000000u);
    deadline.tv_nsec = (long)(ns % 1000000000u);
    pthread_mutex_lock(&s_lock);
    while (!q->done) {
        if (pthread_cond_clockwait(&s_cond, &s_lock, CLOCK_MONOTONIC, &deadline) == ETIMEDOUT)
            break;
    }
    if (!q->done) {
        q->abandoned = true; /* the helper frees it */
        pthread_mutex_unlock(&s_lock);
        atomic_fetch_add_explicit(&s_timeouts, 1, memory_order_relaxed);
        return -ETIMEDOUT;
    }
    pthread_mutex_unlock(&s_lock);
    int r = q->result;
    if (r >= 0)
        *ret_st = q->st;
    free(q);
    return r;
}
