/* common/macros.h: small helpers every component uses.
 *
 * Compiler hints, cleanup attributes for service-side code and array helpers. Nothing here
 * allocates; the cleanup helpers call free()/close() and so are for service code only.
 *
 *     HP_CLEANUP_CLOSE int fd = open(path, O_RDONLY | O_CLOEXEC);
 *     if (fd < 0) return -errno;
 *     return HP_TAKE_FD(fd);
 */
#ifndef HP_COMMON_MACROS_H
#define HP_COMMON_MACROS_H

#include <stdlib.h>
#include <unistd.h>

#define HP_LIKELY(x) __builtin_expect(!!(x), 1)
#define HP_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HP_WARN_UNUSED __attribute__((warn_unused_result))
#define HP_NOINLINE __attribute__((noinline))
#define HP_ALWAYS_INLINE inline __attribute__((always_inline))
#define HP_EXPORT __attribute__((visibility("default")))
#define HP_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define HP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define HP_MAX(a, b) ((a) > (b) ? (a) : (b))
#define HP_ALIGN_UP(x, a) (((x) + ((a)-1)) & ~((__typeof__(x))(a)-1))

static inline void hp__freep(void *p)
{
    free(*(void **)p);
}

static inline void hp__closep(const int *fd)
{
    if (*fd >= 0)
        (void)close(*fd);
}

#define HP_CLEANUP_FREE __attribute__((cleanup(hp__freep)))
#define HP_CLEANUP_CLOSE __attribute__((cleanup(hp__closep)))

/* Returns the fd and disarms the cleanup of the variable holding it. */
#define HP_TAKE_FD(fd)                                                                             \
    ({                                                                                             \
        int hp__fd_ = (fd);                                                                        \
        (fd) = -1;                                                                                 \
        hp__fd_;                                                                                   \
    })

#define HP_TAKE_PTR(p)                                                                             \
    ({                                                                                             \
        __typeof__(p) hp__p_ = (p);                                                                \
        (p) = NULL;                                                                                \
        hp__p_;                                                                                    \
    })

/* The value of hex digit @c (either case), or -1: for the parsers of /proc/PID/maps, perf
 * maps and URLs. */
static inline int hp_hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

#endif
