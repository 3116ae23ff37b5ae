/* tests/unwinder/libunwinline.c: calls made from inlined code, built -O2 -g, for the
 * source lines of inlined frames (tests/unwinder/test_srcline.c). unwinline_outer()
 * inlines unwinline_middle(), which inlines unwinline_inner(), which calls
 * unwinline_capture(): its return address lies in unwinline_outer's code, in the lines
 * of unwinline_inner. unwinline_deep() does the same through 40 inlined levels. Each
 * call passes __LINE__ of its own line: the test compares the DWARF's lines with them. */
#include <stdint.h>

#define NOINLINE __attribute__((noinline))
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define BARRIER() __asm__ volatile("" ::: "memory")

uintptr_t unwinline_ra;
int unwinline_lines[3];  /* the calls in inner, middle, outer */
int unwinline_deep_line; /* the call of deep39 in unwinline_deep */

void unwinline_capture(int inner, int middle, int outer);
void unwinline_outer(void);
void unwinline_deep(void);

NOINLINE void unwinline_capture(int inner, int middle, int outer)
{
    unwinline_ra = (uintptr_t)__builtin_return_address(0);
    unwinline_lines[0] = inner;
    unwinline_lines[1] = middle;
    unwinline_lines[2] = outer;
    BARRIER();
}

static ALWAYS_INLINE void unwinline_inner(int middle, int outer)
{
    unwinline_capture(__LINE__, middle, outer);
    BARRIER();
}

static ALWAYS_INLINE void unwinline_middle(int outer)
{
    unwinline_inner(__LINE__, outer);
    BARRIER();
}

NOINLINE void unwinline_outer(void)
{
    unwinline_middle(__LINE__);
    BARRIER();
}

/* deep0 (innermost) .. deep39, each inlined into the next. */
#define DEEP(n, inner)                                                                             \
    static ALWAYS_INLINE void deep##n(void)                                                        \
    {                                                                                              \
        inner;                                                                                     \
        BARRIER();                                                                                 \
    }
/* clang-format off */
DEEP(0, unwinline_capture(0, 0, 0))
DEEP(1, deep0())
DEEP(2, deep1())
DEEP(3, deep2())
DEEP(4, deep3())
DEEP(5, deep4())
DEEP(6, deep5())
DEEP(7, deep6())
DEEP(8, deep7())
DEEP(9, deep8())
DEEP(10, deep9())
DEEP(11, deep10())
DEEP(12, deep11())
DEEP(13, deep12())
DEEP(14, deep13())
DEEP(15, deep14())
DEEP(16, deep15())
DEEP(17, deep16())
DEEP(18, deep17())
DEEP(19, deep18())
DEEP(20, deep19())
DEEP(21, deep20())
DEEP(22, deep21())
DEEP(23, deep22())
DEEP(24, deep23())
DEEP(25, deep24())
DEEP(26, deep25())
DEEP(27, deep26())
DEEP(28, deep27())
DEEP(29, deep28())
DEEP(30, deep29())
DEEP(31, deep30())
DEEP(32, deep31())
DEEP(33, deep32())
DEEP(34, deep33())
DEEP(35, deep34())
DEEP(36, deep35())
DEEP(37, deep36())
DEEP(38, deep37())
DEEP(39, deep38())
/* clang-format on */

NOINLINE void unwinline_deep(void)
{
    unwinline_deep_line = __LINE__ + 1;
    deep39();
    BARRIER();
}
