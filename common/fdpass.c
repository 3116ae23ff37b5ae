/* common/fdpass.c: descriptors over a UNIX socket (fdpass.h). */
#include "common/fdpass.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/sys.h"

int hp_send_fds(int sock, const void *buf, size_t len, const int *fds, size_t nfds)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * HP_MAX_PASSED_FDS)];
        struct cmsghdr align;
    } u;
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};

    if (nfds > HP_MAX_PASSED_FDS || len == 0)
        return -EINVAL;
    if (nfds > 0) {
        memset(&u, 0, sizeof(u));
        msg.msg_control = u.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    for (;;) {
        long n = hp_sys3(SYS_sendmsg, sock, (long)&msg, MSG_NOSIGNAL);
        if (n == -EINTR)
            continue;
        if (n < 0)
            return (int)n;
        if ((size_t)n != len)
            return -EBADMSG; /* stream sockets of this size never split a small message */
        return 0;
    }
}

int hp_recv_fds(int sock, void *buf, size_t len, int *fds, size_t max_fds, size_t *ret_nfds)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * HP_MAX_PASSED_FDS)];
        struct cmsghdr align;
    } u;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    size_t got = 0;
    long n;

    msg.msg_control = u.buf;
    msg.msg_controllen = sizeof(u.buf);
    do
        n = hp_sys3(SYS_recvmsg, sock, (long)&msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    while (n == -EINTR);
    if (n < 0)
        return (int)n;

    /* Collect every descriptor first so none leaks, whatever the message looks like. */
    int received[HP_MAX_PASSED_FDS * 2];
    size_t nrecv = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t cnt = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < cnt; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (nrecv < sizeof(received) / sizeof(received[0]))
                received[nrecv++] = fd;
            else
                (void)hp_sys_close(fd);
        }
    }
    bool ok = (size_t)n == len && !(msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC));
    for (size_t i = 0; i < nrecv; i++) {
        if (ok && got < max_fds)
            fds[got++] = received[i];
        else
            (void)hp_sys_close(received[i]);
    }
    if (n == 0)
        return -ECONNRESET;
    if (!ok) {
        for (size_t i = 0; i < got; i++)
            (void)hp_sys_close(fds[i]);
        return -EBADMSG;
    }
    *ret_nfds = got;
    return 0;
}
