/* tests/programs/fake_service.c: a process of the program's own uid that plays the
 * profiling service without being it (tests/e2e/test_attach_trust.c). It listens on
 * SOCK, takes one connection and prints what it got:
 *
 *   unsealed SOCK   answers the hello with PROFILE, an unsealed ring and an unsealed
 *                   unwind table (valid headers, interval 1), then truncates both to
 *                   nothing: a client that mapped them dies of SIGBUS in malloc. Prints
 *                   "client refused" when the client hung up before the truncation.
 *   squat SOCK      listens on the socket path of an attacher it is not; prints how many
 *                   descriptors the client's hello carried ("got nothing" without one).
 *   attach PID      is the attacher itself: listens on its own attach socket (in
 *                   $XDG_RUNTIME_DIR), wakes the dormant program PID as `heapprof attach`
 *                   does, and serves it as "unsealed" does (tests/e2e/test_attach_matrix.c:
 *                   the program is attached by us and by the real service in turn).
 *
 * Prints "listening" once SOCK accepts connections; exits 0, 1 on a setup failure. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/fdpass.h"
#include "common/paths.h"
#include "service/targets.h"
#include "shmem_ring/ring_layout.h"
#include "shmem_ring/utable.h"
#include "shmem_ring/wire.h"

#define FAKE_RING_SIZE RING_MIN_SIZE

static int fail(const char *what)
{
    printf("fake_service: %s: %s\n", what, strerror(errno));
    return 1;
}

static int listen_at(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || strlen(path) >= sizeof(sa.sun_path))
        return -1;
    strcpy(sa.sun_path, path);
    (void)unlink(path);
    if (bind(s, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(s, 4) < 0)
        return -1;
    return s;
}

/* Accepts one connection within @timeout_ms; -1 when none came. */
static int accept_one(int lsock, int timeout_ms)
{
    struct pollfd p = {.fd = lsock, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) != 1)
        return -1;
    return accept4(lsock, NULL, NULL, SOCK_CLOEXEC);
}

/* An unsealed memfd of @len bytes whose first @hdr_len bytes are @hdr. */
static int unsealed_file(const char *name, size_t len, const void *hdr, size_t hdr_len)
{
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)len) < 0 || pwrite(fd, hdr, hdr_len, 0) != (ssize_t)hdr_len)
        return -1;
    return fd;
}

/* True when the peer hangs up within @ms. */
static bool hung_up_within(int sock, int ms)
{
    struct pollfd p = {.fd = sock, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, ms) != 1)
        return false;
    char c;
    return recv(sock, &c, 1, MSG_DONTWAIT | MSG_PEEK) <= 0;
}

static int serve_unsealed(int sock)
{
    struct wire_hello hello;
    int fds[2] = {-1, -1};
    size_t nfds = 0;
    if (hp_recv_fds(sock, &hello, sizeof(hello), fds, 2, &nfds) < 0)
        return fail("hello");
    for (size_t i = 0; i < nfds; i++)
        close(fds[i]);
    struct ring_shared rh = {.magic = RING_HEADER_MAGIC, .data_size = FAKE_RING_SIZE};
    struct utable_header th = {.magic = UTABLE_MAGIC, .n_slots = UTABLE_MIN_SLOTS};
    atomic_init(&th.gen, 1);
    int files[2] = {
        unsealed_file("fake-ring", RING_HEADER_SIZE + FAKE_RING_SIZE, &rh, sizeof(rh)),
        unsealed_file("fake-utable",
                      sizeof(struct utable_header) + UTABLE_MIN_SLOTS * sizeof(struct utable_slot),
                      &th, sizeof(th)),
    };
    if (files[0] < 0 || files[1] < 0)
        return fail("memfd");
    struct wire_client_config cfg = {
        .magic = WIRE_CONFIG_MAGIC,
        .status = WIRE_STATUS_PROFILE,
        .features = hello.features & WIRE_FEATURE_UNWIND_TABLE,
        .sampling_interval_bytes = 1,
        .max_stack_bytes = 4096,
    };
    size_t n = cfg.features & WIRE_FEATURE_UNWIND_TABLE ? 2 : 1;
    if (hp_send_fds(sock, &cfg, sizeof(cfg), files, n) < 0)
        return fail("answer");
    bool refused = hung_up_within(sock, 300);
    /* What a peer that kept the right to resize could do at any time. */
    if (ftruncate(files[0], 0) < 0 || ftruncate(files[1], 0) < 0)
        return fail("truncate");
    printf("%s\n", refused ? "client refused" : "client mapped the files, truncated them");
    if (!refused)
        (void)hung_up_within(sock, 3000);
    return 0;
}

static int serve_squat(int sock)
{
    struct wire_hello hello;
    int fds[2] = {-1, -1};
    size_t nfds = 0;
    int r =
        hung_up_within(sock, 5000) ? -1 : hp_recv_fds(sock, &hello, sizeof(hello), fds, 2, &nfds);
    if (r < 0 || nfds == 0)
        printf("got nothing\n");
    else
        printf("got hello with %zu fds\n", nfds);
    for (size_t i = 0; i < nfds; i++)
        close(fds[i]);
    return 0;
}

/* Wakes @pid (dormant, its library loaded) naming us as its attacher, within 5 s. */
static int wake(pid_t pid)
{
    struct svc_proc p;
    for (int i = 0; i < 500; i++) {
        if (svc_proc_inspect(pid, &p) < 0)
            return fail("inspect");
        if (p.attach_ready)
            break;
        (void)poll(NULL, 0, 10);
    }
    char why[512];
    int r = svc_proc_wake(&p, getpid(), why, sizeof(why));
    if (r != 0) {
        printf("fake_service: wake: %s\n", why);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 1;
    setvbuf(stdout, NULL, _IONBF, 0);
    bool attach = strcmp(argv[1], "attach") == 0;
    char path[HP_PATH_MAX], err[256];
    if (attach &&
        (hp_runtime_dir_prepare(path, sizeof(path), err, sizeof(err)) < 0 ||
         hp_socket_path(getenv("XDG_RUNTIME_DIR"), getuid(), getpid(), path, sizeof(path)) < 0))
        return fail("socket path");
    if (!attach)
        snprintf(path, sizeof(path), "%s", argv[2]);
    int lsock = listen_at(path);
    if (lsock < 0)
        return fail("listen");
    printf("listening\n");
    if (attach && wake((pid_t)atoi(argv[2])) != 0) {
        (void)unlink(path);
        return 1;
    }
    int sock = accept_one(lsock, 10000);
    if (sock < 0) {
        printf("no connection\n");
        (void)unlink(path);
        return 0;
    }
    int r = strcmp(argv[1], "squat") == 0 ? serve_squat(sock) : serve_unsealed(sock);
    (void)unlink(path);
    return r;
}
