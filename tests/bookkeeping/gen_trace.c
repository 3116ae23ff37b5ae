/* tests/bookkeeping/gen_trace.c: writes a small but complete heapprof trace (two
 * processes, two dumps, dump_at_max) to the file named by argv[1], for checks with
 * external decoders such as `protoc --decode=perfetto.protos.Trace`. With "big" as
 * argv[2]: 2000 callsites in two heaps, five dumps split into packets of ~4 KB,
 * addresses reused and freed in between (seeded). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bookkeeping/bookkeeping.h"
#include "bookkeeping/state.h"

/* Source lines for libc frames only, as debug info would give for one library. */
static int source_lines(void *ctx, const struct hp_mapping *m, uint64_t rel_pc, bool wait,
                        const struct hp_source_line **ret_lines, size_t *ret_n)
{
    (void)wait;
    static struct hp_source_line l;
    (void)ctx;
    if (strcmp(m->path, "/usr/lib/x86_64-linux-gnu/libc.so.6") != 0)
        return -ENOENT;
    l = (struct hp_source_line){
        .function_name = "", .file = "malloc/malloc.c", .line = (uint32_t)(rel_pc & 0xfff)};
    *ret_lines = &l;
    *ret_n = 1;
    return 0;
}

static int write_big(int fd)
{
    static char names[2000][16];
    static const struct hp_mapping lib = {
        .start = 0x7f0000000000, .end = 0x7f0000400000, .path = "/usr/lib/libbig.so"};
    bk_t *bk;
    int r = bk_new(&(struct bk_config){.out_fd = fd, .sequence_id = 3, .dump_at_max = true}, &bk);
    if (r < 0)
        return r;
    bk__set_max_packet_bytes(bk, 4096);
    r = bk_process_start(bk, 10, "big", 3, true, 4096);
    uint64_t s = 12345, seq = 0;
    for (int d = 0; d < 5 && r == 0; d++) {
        for (int i = 0; i < 4000; i++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            unsigned k = (unsigned)(s % 2000);
            uint32_t heap = (uint32_t)(s >> 40) % 2;
            uint64_t addr = 0x10000 + (s >> 20) % 3000 * 16;
            if ((s >> 50) % 3 == 0) {
                bk_record_free(bk, 10, heap, ++seq, addr);
                continue;
            }
            snprintf(names[k], sizeof(names[k]), "fn%u", k);
            struct hp_frame f[3] = {{&lib, names[k], 0x1000u + k},
                                    {&lib, k % 2 ? "odd" : "even", 0x100u + k % 2},
                                    {&lib, "main", 0x10}};
            bk_record_alloc(bk, 10, heap, ++seq, addr, 100, 4096 + k, f, 3);
        }
        r = bk_dump_all(bk);
    }
    bk_free(bk);
    return r;
}

int main(int argc, char **argv)
{
    if (argc != 2 && !(argc == 3 && !strcmp(argv[2], "big"))) {
        fprintf(stderr, "usage: %s OUT.pftrace [big]\n", argv[0]);
        return 2;
    }
    if (argc == 3) {
        int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        int r = fd < 0 ? -1 : write_big(fd);
        if (fd < 0 || close(fd) < 0 || r < 0) {
            fprintf(stderr, "writing %s failed\n", argv[1]);
            return 1;
        }
        return 0;
    }
    int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    struct hp_mapping libc = {.start = 0x7f0000000000,
                              .end = 0x7f0000200000,
                              .exact_offset = 0x28000,
                              .start_offset = 0,
                              .load_bias = 0,
                              .path = "/usr/lib/x86_64-linux-gnu/libc.so.6",
                              .build_id_len = 4,
                              .build_id = {0xde, 0xad, 0xbe, 0xef}};
    struct hp_mapping app = {.start = 0x400000, .end = 0x401000, .path = "/usr/bin/app"};
    struct hp_frame stack_a[] = {{&libc, "malloc", 0x1234},
                                 {&app, "_ZN3foo3barEv", 0x100},
                                 {&app, "main", 0x80},
                                 {NULL, "", 0xdead}};
    struct hp_frame stack_b[] = {{&app, "make_buffer", 0x200}, {&app, "main", 0x80}};

    bk_t *bk;
    int r = bk_new(
        &(struct bk_config){
            .out_fd = fd, .sequence_id = 7, .dump_at_max = true, .source_lines = source_lines},
        &bk);
    if (r < 0) {
        fprintf(stderr, "bk_new: %s\n", strerror(-r));
        return 1;
    }
    r = bk_process_start(bk, 100, "app\0--flag\0", 11, true, 4096);
    if (r == 0)
        r = bk_process_start(bk, 200, "other", 5, false, 512);
    for (uint64_t i = 0; i < 10 && r == 0; i++) {
        bk_record_alloc(bk, 100, 0, 2 * i + 1, 0x1000 + i * 64, 64, 4096, stack_a, 4);
        bk_record_alloc(bk, 100, 0, 2 * i + 2, 0x9000 + i * 64, 64, 8192, stack_b, 2);
        bk_record_alloc(bk, 200, 0, i + 1, 0x5000 + i * 64, 16, 512, stack_b, 2);
    }
    if (r == 0)
        r = bk_dump_all(bk);
    for (uint64_t i = 0; i < 5 && r == 0; i++)
        bk_record_free(bk, 100, 0, 21 + i, 0x1000 + i * 64);
    struct bk_process_stats st = {.heap_samples = 25, .unwinding_errors = 1};
    if (r == 0)
        r = bk_process_end(bk, 100, &st, BK_FLAG_DISCONNECTED);
    if (r == 0)
        r = bk_dump_all(bk);
    bk = bk_free(bk);
    if (close(fd) < 0 || r < 0) {
        fprintf(stderr, "writing %s failed\n", argv[1]);
        return 1;
    }
    return 0;
}
