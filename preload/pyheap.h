/* preload/pyheap.h: the python.objects heap, the objects CPython 3.11's object allocator
 * serves (PyObject_Malloc & co: pymalloc, which keeps small objects out of malloc's
 * sight), recorded without PYTHONMALLOC=malloc.
 *
 * A session that selects python.objects in a process running CPython 3.11 (python.h,
 * READY) puts a wrapper in front of the object domain's allocator (PyMem_SetAllocator(
 * PYMEM_DOMAIN_OBJ)): the same ctx, functions that call the saved ones and report their
 * blocks to the heap as the heap API does (heapapi.c: the thread's sampler, Python
 * frames on the sample, the heap's own set of sampled blocks for the frees). A realloc
 * is the free of the old block and the allocation of the new one.
 *
 * When: the allocator's struct is copied by PyMem_SetAllocator 4 bytes at a time (rep
 * movsl in Debian's build), so a thread that calls PyObject_Malloc during the write
 * could jump to half of each pointer. It is written only where no such call can run:
 *   - at a startup session (the library's constructor, the child of fork): one thread;
 *   - in a sampled allocation of a thread that holds the GIL, which every caller of the
 *     object domain must hold (client_py_holds_gil());
 *   - by the wrapper itself, called under the GIL, which puts the saved allocator back
 *     at its first call after the session ended.
 * Blocks the wrapper saw are freed by the saved allocator later: the wrapper never
 * changes memory.
 *
 * Not installed (client_stat_pyheap_skipped, counted once) when the object domain is
 * malloc already (PYTHONMALLOC=malloc: malloc's hooks see the objects, which must not
 * count twice) or carries a context (the debug hooks, tracemalloc, another tool's
 * wrapper).
 *
 * Objects that pymalloc hands to malloc (above its 512 bytes, or of 0 bytes) are
 * python.objects' alone: the heap is every block the object allocator gives out, whoever
 * serves it, so that a line that makes objects shows them whatever their size; malloc's
 * heap keeps the rest. The wrapper marks the thread with the block's size while it is in
 * the allocator (client_tls.pyobj_size), and a malloc, calloc or realloc sampled meanwhile
 * for a block of that size is not recorded: CPython 3.11's pymalloc asks malloc for the
 * object's own size only then (0 as 1); the other calls it makes meanwhile, for its table
 * of arenas (768 bytes and more) and its arena map (pages), are for more than the 512
 * bytes that objects it serves itself take.
 * Either way a block is counted once, in one heap.
 */
#ifndef HP_PRELOAD_PYHEAP_H
#define HP_PRELOAD_PYHEAP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "shmem_ring/wire.h"

#pragma GCC visibility push(hidden)

struct client_session;

/* The heap's name, as the service selects it. */
#define CLIENT_PYHEAP_NAME WIRE_HEAP_PYTHON_NAME

/* Times the object allocator was found unfit (malloc-based or wrapped): at most once per
 * allocator seen. */
extern _Atomic uint64_t client_stat_pyheap_skipped;

/* Session @s was published (its heaps announced): installs the wrapper when @s selects
 * python.objects and @single_threaded (a startup session). */
void client__pyheap_open(struct client_session *s, bool single_threaded);

/* On a sampled allocation of @s, in a Python process: installs the wrapper when @s
 * selects python.objects, it is not in place and the thread holds the GIL. Hook-safe. */
void client_pyheap_poll(struct client_session *s);

/* The heap's id once registered (at the first session in a CPython 3.11 process), else
 * 0. */
uint32_t client_pyheap_id(void);

/* True while the wrapper is the object domain's allocator (as last written by us). */
bool client_pyheap_installed(void);

#pragma GCC visibility pop

#endif
