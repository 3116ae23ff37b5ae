/* tests/fuzz/fuzz_handshake.c: the service's reading and checking of a client's hello
 * (svc__handshake_hello) on arbitrary bytes arriving on a socket, with or without
 * descriptors. It must never crash, hang or leak a descriptor, and must accept only a
 * hello naming this process with this process's own /proc maps and mem.
 *
 * Input layout:
 *   byte 0       bits 0-2: descriptors sent with the first message: 0 none, 1 our own
 *                /proc/self/maps and mem, 2 /dev/null twice, 3 only maps, 4 maps and mem
 *                swapped, 5 three descriptors, 6 our /proc/PID/maps and mem by pid,
 *                7 the parent's /proc maps and mem;
 *                bit 3: keep the writer open (the read then times out instead of EOF);
 *                bit 4: allow_other_users;
 *                bit 5: patch the hello's pid to ours; bit 6: patch the magic
 *   byte 1       split point: the bytes go in two messages, the first this long
 *   the rest     the bytes sent (at most 4 KiB)
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/fdpass.h"
#include "common/log.h"
#include "service/svc_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int open_proc(pid_t pid, const char *what)
{
    char path[64];
    if (pid)
        snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, what);
    else
        snprintf(path, sizeof(path), "/proc/self/%s", what);
    return open(path, O_RDONLY | O_CLOEXEC);
}

/* Lowest free descriptor number: unchanged after each input, or a descriptor leaked. */
static int lowest_free_fd(void)
{
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd >= 0)
        (void)close(fd);
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    hp_log_set_level(HP_LOG_ERROR); /* every refused hello logs a warning */
    int fd_mark = lowest_free_fd();
    uint8_t mode = data[0];
    size_t split = data[1];
    uint8_t msg[4096];
    size_t len = size - 2 < sizeof(msg) ? size - 2 : sizeof(msg);
    memcpy(msg, data + 2, len);
    if (len >= sizeof(struct wire_hello)) {
        struct wire_hello h;
        memcpy(&h, msg, sizeof(h));
        if (mode & 0x20)
            h.pid = getpid();
        if (mode & 0x40)
            h.magic = WIRE_HELLO_MAGIC;
        memcpy(msg, &h, sizeof(h));
    }

    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        abort();
    struct timeval tv = {.tv_sec = 0, .tv_usec = 2000};
    (void)setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));

    int fds[3] = {-1, -1, -1};
    size_t nfds = 0;
    switch (mode & 7) {
    case 0:
        break;
    case 1:
    case 5:
        fds[0] = open_proc(0, "maps");
        fds[1] = open_proc(0, "mem");
        nfds = 2;
        if ((mode & 7) == 5) {
            fds[2] = open("/dev/null", O_RDONLY | O_CLOEXEC);
            nfds = 3;
        }
        break;
    case 2:
        fds[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        fds[1] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        nfds = 2;
        break;
    case 3:
        fds[0] = open_proc(0, "maps");
        nfds = 1;
        break;
    case 4:
        fds[0] = open_proc(0, "mem");
        fds[1] = open_proc(0, "maps");
        nfds = 2;
        break;
    case 6:
        fds[0] = open_proc(getpid(), "maps");
        fds[1] = open_proc(getpid(), "mem");
        nfds = 2;
        break;
    case 7:
        fds[0] = open_proc(getppid(), "maps");
        fds[1] = open_proc(getppid(), "mem");
        nfds = 2;
        break;
    }
    /* Send only the descriptors that opened (another process's mem may be refused). */
    int send_fds[3];
    size_t nsend = 0;
    for (size_t i = 0; i < nfds; i++)
        if (fds[i] >= 0)
            send_fds[nsend++] = fds[i];

    if (split > len)
        split = len;
    if (len) {
        size_t first = split ? split : len;
        if (nsend)
            (void)!hp_send_fds(sv[1], msg, first, send_fds, nsend); /* as send() below */
        else
            (void)!send(sv[1], msg, first, MSG_NOSIGNAL);
        if (first < len)
            (void)!send(sv[1], msg + first, len - first, MSG_NOSIGNAL);
    }
    for (size_t i = 0; i < 3; i++)
        if (fds[i] >= 0)
            (void)close(fds[i]);
    if (!(mode & 8))
        (void)shutdown(sv[1], SHUT_WR);

    struct wire_hello hello;
    struct ucred cred;
    int got[2] = {-1, -1};
    int r = svc__handshake_hello(sv[0], (mode & 0x10) != 0, &hello, &cred, got);
    if (r == 0) {
        /* Accepted: it must be a hello of ours with our own /proc files. */
        if (hello.magic != WIRE_HELLO_MAGIC || hello.pid != getpid() || cred.pid != getpid() ||
            got[0] < 0 || got[1] < 0)
            abort();
        (void)close(got[0]);
        (void)close(got[1]);
    }
    (void)close(sv[0]);
    (void)close(sv[1]);
    if (lowest_free_fd() != fd_mark)
        abort();
    return 0;
}
