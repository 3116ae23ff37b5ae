/* tests/programs/hostile_lib.c: a shared library whose code has its CFI only in
 * .debug_frame (built with -fno-asynchronous-unwind-tables -fno-unwind-tables -g), so the
 * service unwinds through it with its elfutils fallback. hostile_client maps a copy of
 * it, takes stack snapshots through both functions, then replaces the copy's path with a
 * FIFO or truncates the file (tests/programs/hostile_client.c). hl_second is defined
 * after hl_first, so its CFI comes later in .debug_frame: read only when first needed. */
#define NOINLINE __attribute__((noinline, noclone))
#define BARRIER() __asm__ volatile("" ::: "memory")

void hl_first(void (*cb)(int), int k);
void hl_second(void (*cb)(int), int k);

NOINLINE void hl_first(void (*cb)(int), int k)
{
    cb(k);
    BARRIER();
}

NOINLINE void hl_second(void (*cb)(int), int k)
{
    cb(k + 1);
    BARRIER();
}
