/* tests/fuzz/fuzz_fake_smb.c: the fake tracing service's reading of shared memory
 * written by a producer (page words, chunk headers, fragments, packets), on arbitrary
 * bytes: what the producer's tests trust to judge it must not crash or misread. */
#include <stddef.h>
#include <stdint.h>

#include "tests/producer/fake_traced.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ft_fuzz_smb(data, size);
    return 0;
}
