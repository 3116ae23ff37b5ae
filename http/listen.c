/* http/listen.c: the endpoint's listening socket: the address given to --http, loopback
 * unless the user says otherwise. */
#include "http/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int http_parse_listen(const char *spec, char *host, size_t host_len, uint16_t *ret_port, char *err,
                      size_t err_len)
{
    const char *port = spec, *h = "";
    size_t hl = 0;
    if (spec[0] == '[') {
        const char *close_br = strchr(spec, ']');
        if (!close_br || close_br[1] != ':') {
            snprintf(err, err_len, "'%s': an IPv6 address is written [ADDR]:PORT", spec);
            return -EINVAL;
        }
        h = spec + 1;
        hl = (size_t)(close_br - h);
        port = close_br + 2;
    } else {
        const char *colon = strrchr(spec, ':');
        if (colon) {
            if (memchr(spec, ':', (size_t)(colon - spec))) {
                snprintf(err, err_len, "'%s': an IPv6 address is written [ADDR]:PORT", spec);
                return -EINVAL;
            }
            h = spec;
            hl = (size_t)(colon - spec);
            port = colon + 1;
        }
    }
    char *end;
    errno = 0;
    unsigned long p = strtoul(port, &end, 10);
    if (!*port || *end || errno || p > 65535 || port[0] == '-' || port[0] == '+' ||
        port[0] == ' ') {
        snprintf(err, err_len, "'%s': the port is not a number in 0..65535", spec);
        return -EINVAL;
    }
    if (hl >= host_len) {
        snprintf(err, err_len, "'%s': the address is too long", spec);
        return -EINVAL;
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    *ret_port = (uint16_t)p;
    return 0;
}

static bool is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const void *)sa;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const void *)sa;
        if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
            return true;
        return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
    }
    return false;
}

/* The base URL of the socket @fd is bound to. */
static void url_of(int fd, char *url, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char a[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET6) {
            const struct sockaddr_in6 *in6 = (const void *)&ss;
            inet_ntop(AF_INET6, &in6->sin6_addr, a, sizeof(a));
            port = ntohs(in6->sin6_port);
            snprintf(url, len, "http://[%s]:%u/", a, port);
            return;
        }
        const struct sockaddr_in *in = (const void *)&ss;
        inet_ntop(AF_INET, &in->sin_addr, a, sizeof(a));
        port = ntohs(in->sin_port);
    }
    snprintf(url, len, "http://%s:%u/", a, port);
}

static int bind_listen(const struct addrinfo *ai, int *ret_fd)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0)
        return -errno;
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 128) < 0) {
        int r = -errno;
        (void)close(fd);
        return r;
    }
    *ret_fd = fd;
    return 0;
}

int http_listen(const char *spec, bool allow_remote, int *ret_fd, char *url, size_t url_len,
                char *err, size_t err_len)
{
    char host[256], port[8];
    uint16_t p;
    int r = http_parse_listen(spec, host, sizeof(host), &p, err, err_len);
    if (r < 0)
        return r;
    snprintf(port, sizeof(port), "%u", (unsigned)p);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gr = getaddrinfo(host[0] ? host : "127.0.0.1", port, &hints, &res);
    if (gr != 0 || !res) {
        snprintf(err, err_len, "'%s': %s", spec, gr ? gai_strerror(gr) : "no address");
        return -EADDRNOTAVAIL;
    }
    r = 0;
    for (const struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        if (!allow_remote && !is_loopback(ai->ai_addr)) {
            snprintf(err, err_len,
                     "'%s' is not a loopback address: anyone who can reach it could read the "
                     "profiles (function names, command lines); add --http-allow-remote to "
                     "serve them there",
                     spec);
            r = -EPERM;
            break;
        }
    }
    if (r == 0) {
        r = bind_listen(res, ret_fd);
        if (r < 0)
            snprintf(err, err_len, "cannot listen on '%s': %s", spec, strerror(-r));
        else
            url_of(*ret_fd, url, url_len);
    }
    freeaddrinfo(res);
    return r;
}
