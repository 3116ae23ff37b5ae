/* preload/python.h: the Python frames a thread of a CPython 3.11 program runs when it
 * allocates, so that the service can put them in the sample's stack in place of the
 * interpreter's evaluation loop.
 *
 * Finding the runtime: the objects the loader mapped are searched once for CPython's
 * exported symbols (Py_Version, PyGILState_GetThisThreadState, PyCode_Type), in the
 * executable (a static libpython) or in libpython3.11.so. Only a release build of 3.11
 * is read: its object layouts are the same in every 3.11.x (a debug build's are not).
 * Other versions are named to the service as unsupported, once per session, and left
 * alone.
 *
 * Capture, on the sampled path only: the thread's PyThreadState (a pthread key read,
 * through PyGILState_GetThisThreadState(): no allocation, no lock), then its chain of
 * evaluation frames, cframe->current_frame -> previous, innermost first, each as its
 * code object and the instruction it runs, with the bit that says where one run of the
 * evaluation loop began. Loads that cannot fault are plain: the thread state's fields
 * (alive while the thread's key names it), the C frame when it lies on the thread's own
 * stack or in the thread state, and frames in the chunk of the frame stack the thread
 * pushes on now (mapped while it is the thread's). Every other load goes through
 * process_vm_readv(2) on ourselves, so a bad pointer costs a failed read, never a fault;
 * the code objects (which a frame being torn down may have let go) are read and checked
 * in one such call for all frames. A sample thus costs one system call where it cost
 * one per frame and more, and none when every code object is known good already: while
 * the python.objects wrapper sees every free of the object allocator, the code objects
 * checked once are kept until freed (client_py_codes, preload/pycodes.h).
 *
 *     if (client_py_state() == CLIENT_PY_READY)
 *         n = client_py_capture(pid, sp, stack_end, frames, WIRE_MAX_PY_FRAMES, known, &flags);
 *
 * Hook-safe: raw system calls, no allocation; detection calls dl_iterate_phdr() (the
 * caller holds the loader's lock or may wait for it).
 */
#ifndef HP_PRELOAD_PYTHON_H
#define HP_PRELOAD_PYTHON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "preload/pycodes.h"
#include "shmem_ring/wire.h"

#pragma GCC visibility push(hidden)

enum {
    CLIENT_PY_UNKNOWN = 0,     /* not looked for yet */
    CLIENT_PY_NONE = 1,        /* no CPython in the process */
    CLIENT_PY_READY = 2,       /* CPython 3.11: frames are captured */
    CLIENT_PY_UNSUPPORTED = 3, /* another version or build: told, never read */
};

/* CLIENT_PY_*. Relaxed load; the runtime's addresses are published before READY. */
int client_py_state(void);

/* Looks for CPython in the loaded objects when not done yet (state UNKNOWN, or NONE
 * and @again: code was loaded since). Calls dl_iterate_phdr(). */
void client_py_detect(int again);

/* What to tell the service (WIRE_PY_RUNTIME) in a READY or UNSUPPORTED state. */
void client_py_runtime(struct wire_py_runtime *ret);

/* The code objects known good (preload/pycodes.h): forgotten by the python.objects
 * wrapper as it frees them, cleared when it is put in place. */
extern struct client_pycodes client_py_codes;

/* The calling thread's Python frames, innermost first, at most @max (<=
 * WIRE_MAX_PY_FRAMES) of them, into @frames; @ret_flags gets WIRE_PYT_*. Returns the
 * count (0: the thread runs no Python code, or has no Python thread state). pre: READY.
 * @pid: ours; [@stack_lo, @stack_hi): the part of the thread's own stack from the
 * sample's stack pointer up, checked readable (preload/stack.h). @known: the wrapper is
 * in place, so client_py_codes may be used for checks. When the thread holds the GIL,
 * the code objects read are kept in client_py_codes, and bit i of @ret_send says frame
 * i's code object is not marked sent in session epoch @epoch (pycodes.h): its
 * WIRE_PY_CODE should go before the sample. */
size_t client_py_capture(pid_t pid, uint64_t stack_lo, uint64_t stack_hi,
                         struct wire_py_frame *frames, size_t max, bool known, uint64_t epoch,
                         uint32_t *ret_flags, uint64_t *ret_send);

/* A WIRE_PY_CODE record to write: its fixed part, and where its bytes are. */
struct client_py_code {
    struct wire_py_code head;
    uint64_t qualname, filename, linetable;
};

/* Reads what the record of the code object at @code (check @check, from a frame the
 * thread runs while holding the GIL) takes into @ret: false when it is not that object
 * any more, or its name or file is not a compact ASCII string, or something is longer
 * than the record carries (the service reads the object then). One or two system calls
 * that cannot fault. */
bool client_py_code_plan(pid_t pid, uint64_t code, uint32_t check, struct client_py_code *ret);

/* Bytes of the record of @c. */
static inline size_t client_py_code_len(const struct client_py_code *c)
{
    return sizeof(c->head) + c->head.qualname_len + c->head.filename_len + c->head.linetable_len;
}

/* Writes the record of @c to @dst (client_py_code_len() bytes). Returns false when its
 * bytes could not be read whole or are not printable: the record then says nothing
 * (code 0). One system call. */
bool client_py_code_fill(pid_t pid, const struct client_py_code *c, uint8_t *dst);

/* CPython's object-allocator API (Include/cpython/pymem.h), for the python.objects heap
 * (preload/pyheap.c): void PyMem_GetAllocator(int domain, PyMemAllocatorEx *),
 * PyMem_SetAllocator(int domain, PyMemAllocatorEx *). */
struct client_py_mem {
    void *get_allocator;
    void *set_allocator;
};

/* The runtime's allocator API; NULL unless READY and the runtime exports it. */
const struct client_py_mem *client_py_mem(void);

/* True when the calling thread holds the GIL: the runtime's current thread state
 * (_PyThreadState_UncheckedGet()) is the thread's own. No lock, no allocation. pre:
 * READY. */
bool client_py_holds_gil(void);

#pragma GCC visibility pop

#endif
