/* common/paths.c: socket paths, hook-safe (paths.h). */
#include "common/paths.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

/* Appends @s to buf[*pos..len). */
static int put(char *buf, size_t len, size_t *pos, const char *s)
{
    size_t n = strlen(s);
    if (*pos + n + 1 > len)
        return -ENAMETOOLONG;
    memcpy(buf + *pos, s, n + 1);
    *pos += n;
    return 0;
}

static int put_uint(char *buf, size_t len, size_t *pos, uint64_t v)
{
    char tmp[24];
    size_t i = sizeof(tmp) - 1;
    tmp[i] = '\0';
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return put(buf, len, pos, tmp + i);
}

int hp_runtime_dir(const char *xdg, uid_t uid, char *buf, size_t len)
{
    size_t pos = 0;
    int r;
    if (len == 0)
        return -ENAMETOOLONG;
    buf[0] = '\0';
    if (xdg && xdg[0] == '/')
        r = put(buf, len, &pos, xdg) ?: put(buf, len, &pos, "/heapprof");
    else
        r = put(buf, len, &pos, "/tmp/heapprof-") ?: put_uint(buf, len, &pos, uid);
    return r;
}

int hp_socket_path(const char *xdg, uid_t uid, pid_t attach_pid, char *buf, size_t len)
{
    int r = hp_runtime_dir(xdg, uid, buf, len);
    if (r < 0)
        return r;
    size_t pos = strlen(buf);
    if (attach_pid <= 0)
        return put(buf, len, &pos, "/" HP_DAEMON_SOCKET_NAME);
    return put(buf, len, &pos, "/attach-") ?: put_uint(buf, len, &pos, (uint64_t)attach_pid)
               ?: put(buf, len, &pos, ".sock");
}

int hp_attach_abstract_name(pid_t attach_pid, char *buf, size_t len)
{
    size_t pos = 0;
    if (len == 0)
        return -ENAMETOOLONG;
    buf[0] = '\0';
    return put(buf, len, &pos, "@heapprof-attach-")
               ?: put_uint(buf, len, &pos, (uint64_t)attach_pid);
}
