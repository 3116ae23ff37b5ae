/* common/sys.h: raw Linux system calls that return the kernel's answer (>= 0, or -errno)
 * and touch nothing else: no errno, no thread-local storage, no cancellation, no lock.
 *
 * For code that must not go through glibc's wrappers: the client's session thread, a
 * clone(2) thread glibc does not know about and that has no glibc thread state of its
 * own (preload/attach.c); the attach signal's handler; the malloc hooks (a wrapper that
 * is a cancellation point would make malloc one). Hook-safe. x86_64 only, as the client.
 *
 *     long fd = hp_sys4(SYS_openat, AT_FDCWD, (long)"/proc/self/maps", O_RDONLY, 0);
 *     if (fd < 0)
 *         return (int)fd; // -errno
 */
#ifndef HP_COMMON_SYS_H
#define HP_COMMON_SYS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/syscall.h>

#if !defined(__x86_64__)
#error "common/sys.h: raw system calls are written for x86_64"
#endif

static inline long hp_sys6(long nr, long a, long b, long c, long d, long e, long f)
{
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}

static inline long hp_sys0(long nr)
{
    return hp_sys6(nr, 0, 0, 0, 0, 0, 0);
}

static inline long hp_sys1(long nr, long a)
{
    return hp_sys6(nr, a, 0, 0, 0, 0, 0);
}

static inline long hp_sys2(long nr, long a, long b)
{
    return hp_sys6(nr, a, b, 0, 0, 0, 0);
}

static inline long hp_sys3(long nr, long a, long b, long c)
{
    return hp_sys6(nr, a, b, c, 0, 0, 0);
}

static inline long hp_sys4(long nr, long a, long b, long c, long d)
{
    return hp_sys6(nr, a, b, c, d, 0, 0);
}

/* True when @v, returned by a system call that answers with an address (mmap), is an
 * error (-4095..-1). */
static inline bool hp_sys_failed(long v)
{
    return (unsigned long)v > -4096ul;
}

/* Mappings: under a sanitizer (never the client: libheapprof.so is not built with one)
 * through libc, whose interceptors must see every mapping come and go, or they keep the
 * history of an unmapped range and report races or overflows in the next mapping there. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HP_SYS_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define HP_SYS_SANITIZED 1
#endif
#endif

#ifdef HP_SYS_SANITIZED
#include <errno.h>
#include <sys/mman.h>

static inline void *hp_sys_mmap(void *addr, size_t len, int prot, int flags, int fd, long off)
{
    void *p = mmap(addr, len, prot, flags, fd, off);
    return p == MAP_FAILED ? (void *)(long)-errno : p;
}

static inline long hp_sys_munmap(void *addr, size_t len)
{
    return munmap(addr, len) < 0 ? -errno : 0;
}
#else
static inline void *hp_sys_mmap(void *addr, size_t len, int prot, int flags, int fd, long off)
{
    return (void *)hp_sys6(SYS_mmap, (long)addr, (long)len, prot, flags, fd, off);
}

static inline long hp_sys_munmap(void *addr, size_t len)
{
    return hp_sys2(SYS_munmap, (long)addr, (long)len);
}
#endif

static inline long hp_sys_close(int fd)
{
    return hp_sys1(SYS_close, fd);
}

#endif
