/* tests/bench/dump_state.h: the bookkeeping state the dump benchmarks measure (bench_
 * bookkeeping.c, bench_producer.c): 1M call sites main > a > b > c (100 x 100 x 100) in
 * process 1, each allocated once (4096 bytes, as at the default interval), every other
 * one freed. Built from records, as the bookkeeping thread builds it. */
#ifndef HP_TESTS_BENCH_DUMP_STATE_H
#define HP_TESTS_BENCH_DUMP_STATE_H

#include <stdio.h>
#include <stdlib.h>

#include "bookkeeping/bookkeeping.h"

#define DUMP_FAN 100
#define DUMP_SITES (DUMP_FAN * DUMP_FAN * DUMP_FAN)

/* A new bookkeeping with @cfg holding the state; frames are in @maps[0..2]. */
static inline bk_t *bench_dump_state(const struct bk_config *cfg, const struct hp_mapping *maps)
{
    static char fnames[3][DUMP_FAN][16];
    for (int l = 0; l < 3; l++)
        for (int i = 0; i < DUMP_FAN; i++)
            snprintf(fnames[l][i], sizeof(fnames[l][i]), "f%d_%d", l, i);
    bk_t *bk;
    if (bk_new(cfg, &bk) < 0 || bk_process_start(bk, 1, "bench", 5, true, 4096) < 0) {
        fprintf(stderr, "bk_new failed\n");
        exit(1);
    }
    uint64_t seq = 0;
    for (uint32_t s = 0; s < DUMP_SITES; s++) {
        uint32_t a = s / (DUMP_FAN * DUMP_FAN), b = (s / DUMP_FAN) % DUMP_FAN, c = s % DUMP_FAN;
        struct hp_frame f[4] = {
            {&maps[2], fnames[2][c], 0x3000u + c},
            {&maps[1], fnames[1][b], 0x2000u + b},
            {&maps[0], fnames[0][a], 0x1000u + a},
            {&maps[0], "main", 0x10},
        };
        bk_record_alloc(bk, 1, 0, ++seq, 0x100000000ull + (uint64_t)s * 32, 32, 4096, f, 4);
    }
    for (uint32_t s = 0; s < DUMP_SITES; s += 2)
        bk_record_free(bk, 1, 0, ++seq, 0x100000000ull + (uint64_t)s * 32);
    return bk;
}

#endif
