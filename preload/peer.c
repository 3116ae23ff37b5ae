/* preload/peer.c: see peer.h. */
#include "preload/peer.h"

#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "common/sys.h"

/* CAP_SYS_PTRACE's bit in /proc/PID/status's CapEff (linux/capability.h). */
#define PEER_CAP_SYS_PTRACE 19
/* Ancestors looked at, at most: pid namespaces nest, chains stay short. */
#define PEER_MAX_DEPTH 4096

bool client_peer_needs_ptrace_facts(const struct client_peer *p)
{
    return p->woken && p->want_pid == 0 && p->yama_scope >= 1 && p->uid != 0;
}

bool client_peer_trusted(const struct client_peer *p)
{
    if (p->uid != p->self_uid && p->uid != 0)
        return false;
    if (p->want_pid > 0)
        return p->pid == p->want_pid;
    if (p->want_pid == CLIENT_PEER_HIDDEN)
        return p->pid == 0;
    if (!client_peer_needs_ptrace_facts(p))
        return true;
    /* A daemon's wake under Yama: whom Yama lets trace us (see peer.h). */
    return p->cap_ptrace || (p->yama_scope == 1 && p->ancestor);
}

/* "/proc/@pid/@what" into @buf (64 bytes). */
static void peer_proc_path(char *buf, pid_t pid, const char *what)
{
    char digits[16];
    size_t n = 0, pos = 0;
    unsigned v = (unsigned)pid;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    memcpy(buf, "/proc/", 6);
    pos = 6;
    while (n)
        buf[pos++] = digits[--n];
    buf[pos++] = '/';
    size_t w = strlen(what);
    memcpy(buf + pos, what, w + 1);
}

/* Reads up to @len - 1 bytes of @path into @buf, NUL-terminated. Returns the length or
 * -errno. */
static long peer_read(const char *path, char *buf, size_t len)
{
    long fd = hp_sys4(SYS_openat, AT_FDCWD, (long)path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return fd;
    size_t n = 0;
    while (n < len - 1) {
        long r = hp_sys3(SYS_read, fd, (long)(buf + n), (long)(len - 1 - n));
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    (void)hp_sys_close((int)fd);
    buf[n] = '\0';
    return (long)n;
}

int client_peer_yama_scope(void)
{
    char buf[16];
    if (peer_read("/proc/sys/kernel/yama/ptrace_scope", buf, sizeof(buf)) <= 0 || buf[0] < '0' ||
        buf[0] > '9')
        return -1;
    return buf[0] - '0';
}

/* The parent of @pid from /proc/@pid/stat ("pid (comm) S ppid ..."; comm may hold
 * anything, so the last ')' ends it), or -1. */
static pid_t peer_parent_of(pid_t pid)
{
    char path[64], buf[512];
    peer_proc_path(path, pid, "stat");
    long n = peer_read(path, buf, sizeof(buf));
    if (n <= 0)
        return -1;
    const char *end = NULL;
    for (const char *c = buf; *c; c++)
        if (*c == ')')
            end = c;
    if (!end || end[1] != ' ' || !end[2] || end[3] != ' ')
        return -1;
    pid_t ppid = 0;
    for (const char *c = end + 4; *c >= '0' && *c <= '9'; c++)
        ppid = ppid * 10 + (*c - '0');
    return ppid;
}

bool client_peer_is_ancestor(pid_t pid)
{
    if (pid <= 0)
        return false;
    pid_t p = (pid_t)hp_sys0(SYS_getppid);
    for (unsigned depth = 0; p > 0 && depth < PEER_MAX_DEPTH; depth++) {
        if (p == pid)
            return true;
        p = peer_parent_of(p);
    }
    return false;
}

/* True when @a and @b name the same namespace file. */
static bool peer_same_ns(const char *a, const char *b)
{
    struct stat sa, sb;
    return hp_sys4(SYS_newfstatat, AT_FDCWD, (long)a, (long)&sa, 0) == 0 &&
           hp_sys4(SYS_newfstatat, AT_FDCWD, (long)b, (long)&sb, 0) == 0 &&
           sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

bool client_peer_has_cap_ptrace(pid_t pid)
{
    char path[64], buf[4096];
    if (pid <= 0)
        return false;
    peer_proc_path(path, pid, "ns/user");
    if (!peer_same_ns(path, "/proc/self/ns/user"))
        return false;
    peer_proc_path(path, pid, "status");
    if (peer_read(path, buf, sizeof(buf)) <= 0)
        return false;
    const char *c = strstr(buf, "\nCapEff:");
    if (!c)
        return false;
    c += 8;
    while (*c == '\t' || *c == ' ')
        c++;
    uint64_t caps = 0;
    for (; (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f'); c++)
        caps = caps << 4 | (uint64_t)(*c <= '9' ? *c - '0' : *c - 'a' + 10);
    return (caps >> PEER_CAP_SYS_PTRACE) & 1;
}
