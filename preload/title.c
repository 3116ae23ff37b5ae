/* preload/title.c: the process's title at exit (preload/title.h). */
#include "preload/title.h"

#include <fcntl.h>
#include <string.h>
#include <sys/syscall.h>

#include "common/sys.h"
#include "preload/client.h"
#include "shmem_ring/wire.h"

/* The kernel reads a title written over the arguments from one page at their start. */
#define TITLE_PAGE 4096

/* Written by the session's opener before the session is published; read at exit. A
 * child of fork() inherits the area, at the same addresses. */
static struct client_title_area title_area;

int client_title_parse_stat(const char *buf, size_t len, struct client_title_area *ret)
{
    /* The command name (field 2) is in parentheses and may hold any byte: the fields
     * that follow start after its last ')'. */
    const char *p = NULL;
    for (size_t i = len; i > 0; i--)
        if (buf[i - 1] == ')') {
            p = buf + i;
            break;
        }
    if (!p)
        return -1;
    const char *end = buf + len;
    uint64_t v[4];
    /* Fields 3.. follow, one space before each (field 3, the state, is a letter); we
     * want 48 to 51, decimal. */
    for (int field = 3; field <= 51; field++) {
        if (p == end || *p != ' ')
            return -1;
        p++;
        const char *tok = p;
        while (p < end && *p != ' ')
            p++;
        if (p == tok)
            return -1;
        if (field < 48)
            continue;
        uint64_t x = 0;
        for (const char *q = tok; q < p; q++) {
            uint64_t d = (uint64_t)(*q - '0');
            if (d > 9 || x > (UINT64_MAX - d) / 10)
                return -1;
            x = x * 10 + d;
        }
        v[field - 48] = x;
    }
    if (v[0] == 0 || v[0] >= v[1] || v[2] > v[3])
        return -1;
    *ret = (struct client_title_area){(uintptr_t)v[0], (uintptr_t)v[1], (uintptr_t)v[2],
                                      (uintptr_t)v[3]};
    return 0;
}

size_t client_title_copy(const struct client_title_area *a, char *out, size_t cap)
{
    if (a->arg_start == 0 || a->arg_start >= a->arg_end)
        return 0;
    /* A title may run on into the environment only where it follows the arguments. */
    uintptr_t env_end = a->env_end;
    if (a->env_start != a->arg_end || a->env_end < a->env_start)
        env_end = a->arg_end;
    const char *p = (const char *)a->arg_start;
    size_t n;
    if (p[a->arg_end - a->arg_start - 1] != '\0') {
        size_t room = env_end - a->arg_start < TITLE_PAGE ? env_end - a->arg_start : TITLE_PAGE;
        n = 0;
        while (n < room && p[n])
            n++;
        if (n < room)
            n++; /* its NUL, as the kernel gives it */
    } else {
        n = a->arg_end - a->arg_start;
    }
    if (n > cap)
        n = cap;
    memcpy(out, p, n);
    return n;
}

void client__title_learn(void)
{
    char buf[1024];
    long fd = hp_sys4(SYS_openat, AT_FDCWD, (long)"/proc/self/stat", O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return;
    size_t len = 0;
    for (;;) {
        long n = hp_sys3(SYS_read, fd, (long)(buf + len), (long)(sizeof(buf) - len));
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len == sizeof(buf))
            break;
    }
    (void)hp_sys_close((int)fd);
    while (len > 0 && buf[len - 1] == '\n')
        len--;
    struct client_title_area a;
    if (client_title_parse_stat(buf, len, &a) == 0)
        title_area = a;
}

void client__title_send(struct client_session *s)
{
    if (!(s->features & WIRE_FEATURE_TITLE))
        return;
    /* Not from a child of fork() made without our handler, on its parent's session. */
    if (s->fork_token ? atomic_load_explicit(s->fork_token, memory_order_relaxed) != s->gen
                      : hp_sys0(SYS_getpid) != s->pid)
        return;
    char title[WIRE_TITLE_MAX];
    size_t n = client_title_copy(&title_area, title, sizeof(title));
    struct ring_wspan w;
    if (n == 0 || ring_try_begin_write_nowait(s->ring, WIRE_TITLE, n, &w) != 0)
        return;
    memcpy(w.data, title, n);
    (void)ring_end_write(s->ring, &w);
}
