/* tests/programs/unhash.h: the inverse of splitmix64's finalizer, the unkeyed hash the
 * service's tables used: unhash(i << 32) gives keys whose hashes share their low 32
 * bits, one home slot in any table smaller than 2^32, the keys an attacker aims with.
 * Used by hostile_client's hash flood and the interning tests. */
#ifndef HP_TESTS_PROGRAMS_UNHASH_H
#define HP_TESTS_PROGRAMS_UNHASH_H

#include <stdint.h>

/* The multiplicative inverse of odd @c modulo 2^64 (Newton's iteration doubles the
 * correct low bits each step). */
static inline uint64_t hp_test_inverse_mod64(uint64_t c)
{
    uint64_t x = c;
    for (int i = 0; i < 6; i++)
        x *= 2 - c * x;
    return x;
}

/* The input whose splitmix64 finalizer output is @y: each xor-shift and multiply undone in
 * reverse order. */
static inline uint64_t hp_test_unhash(uint64_t y)
{
    y ^= y >> 31 ^ y >> 62;
    y *= hp_test_inverse_mod64(0x94d049bb133111ebull);
    y ^= y >> 27 ^ y >> 54;
    y *= hp_test_inverse_mod64(0xbf58476d1ce4e5b9ull);
    y ^= y >> 30 ^ y >> 60;
    return y;
}

#endif
